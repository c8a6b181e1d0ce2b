package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ReleaseOwned releases the grants ts, all of one owner, in one call of
// lease.release_many (pg_lease 0.5.0): each as Release would, in byte
// order of the keys, in one transaction; a key handed over by its release
// goes to its candidate in that transaction. errs[i] is ts[i]'s answer, as
// ReleaseMany reports it; the returned error is for the whole call. At most
// MaxBatch tokens of one owner and distinct keys. On an older server it is
// ReleaseMany.
func (c *Client) ReleaseOwned(ctx context.Context, ts []Token) ([]error, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	if len(ts) > MaxBatch {
		return nil, fmt.Errorf("release_many: %w: %d tokens, at most %d", ErrInvalidInput, len(ts), MaxBatch)
	}
	seen := make(map[string]bool, len(ts))
	for i, t := range ts {
		if t.Owner != ts[0].Owner || seen[t.Key] {
			return nil, fmt.Errorf("release_many: %w: token %d (%q) has another owner than token 0 or a key named before",
				ErrInvalidInput, i, t.Key)
		}
		seen[t.Key] = true
	}
	keys := make([]string, len(ts))
	epochs := make([]int64, len(ts))
	for i, t := range ts {
		keys[i], epochs[i] = t.Key, t.Epoch
	}
	statuses := make([]string, 0, len(ts))
	older := false
	err := retryOnce(ctx, func() error {
		return c.onConn(ctx, "release_many", func() Token { return ts[0] }, func(q Querier) error {
			statuses = statuses[:0]
			r, err := q.Query(ctx, `SELECT r.status FROM lease.release_many($1, $2, $3) r`, keys, ts[0].Owner, epochs)
			if err == nil {
				defer r.Close()
				for r.Next() {
					var st string
					if err := r.Scan(&st); err != nil {
						return err
					}
					statuses = append(statuses, st)
				}
				err = r.Err()
			}
			older = undefinedFunction(err)
			return err
		})
	})
	if older {
		return c.ReleaseMany(ctx, ts)
	}
	if err != nil {
		return nil, mapError("release_many", ts[0], err)
	}
	if len(statuses) != len(ts) {
		return nil, fmt.Errorf("lease: release_many: %d rows from the server for %d keys", len(statuses), len(ts))
	}
	errs := make([]error, len(ts))
	for i, t := range ts {
		errs[i] = statusErr("release", t, statuses[i])
	}
	return errs, nil
}

// AcquireOwned is AcquireMany in one call of lease.acquire_many (pg_lease
// 0.5.0): every key tried once (wait 0) for owner, in byte order, in one
// transaction; the answers are AcquireMany's. On an older server it is
// AcquireMany.
func (c *Client) AcquireOwned(ctx context.Context, keys []string, owner string, ttl time.Duration) (grants []Grant, errs []error, err error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	t := Token{Key: keys[0], Owner: owner}
	if err := checkAcquireMany(t, len(keys), ttl); err != nil {
		return nil, nil, err
	}
	type row struct {
		acquired  bool
		epoch     *int64
		expiresAt *time.Time
	}
	var (
		rows                  []row
		serverNow, sent, recv time.Time
		older                 bool
	)
	err = retryOnce(ctx, func() error {
		return c.onConn(ctx, "acquire_many", func() Token { return t }, func(q Querier) error {
			rows = rows[:0]
			sent = c.clock.Now()
			r, err := q.Query(ctx, `SELECT a.acquired, a.epoch, a.expires_at, clock_timestamp()
  FROM lease.acquire_many($1, $2, $3) a`, keys, owner, ttl)
			if err == nil {
				defer r.Close()
				for r.Next() {
					var x row
					if err := r.Scan(&x.acquired, &x.epoch, &x.expiresAt, &serverNow); err != nil {
						return err
					}
					rows = append(rows, x)
				}
				recv = c.clock.Now()
				err = r.Err()
			}
			older = undefinedFunction(err)
			return err
		})
	})
	if older {
		return c.AcquireMany(ctx, keys, owner, ttl)
	}
	if err != nil {
		return nil, nil, mapError("acquire_many", t, err)
	}
	if len(rows) != len(keys) {
		return nil, nil, fmt.Errorf("lease: acquire_many: %d rows from the server for %d keys", len(rows), len(keys))
	}
	grants, errs = make([]Grant, len(keys)), make([]error, len(keys))
	for i, x := range rows {
		switch {
		case x.acquired && x.epoch != nil && x.expiresAt != nil:
			grants[i] = newGrant(Token{Key: keys[i], Owner: owner, Epoch: *x.epoch}, *x.expiresAt, ttl, sent, serverNow)
		case !x.acquired && x.expiresAt != nil:
			rt := roundTrip{sent: sent, received: recv, serverNow: serverNow}
			errs[i] = &GraceError{Key: keys[i], Until: *x.expiresAt, UntilLocal: rt.latest(*x.expiresAt)}
		}
	}
	return grants, errs, nil
}

// undefinedFunction reports a server without the called lease function.
func undefinedFunction(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42883"
}
