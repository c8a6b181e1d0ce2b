package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxBatch is the most keys one batch call (RenewTerms, AcquireMany,
// ReleaseMany) may carry: the bound of lease.renew_many.
const MaxBatch = 1000

// renewResult is renewMany's answer for one token.
type renewResult struct {
	Token Token
	// Grant is the renewed grant when Err is nil.
	Grant Grant
	// Err is nil when the grant was renewed, else an error matching ErrLost
	// and ErrNotOwner, ErrLapsed or ErrEpochMismatch, as Renew reports it.
	Err error
}

// renewMany renews every grant of ts for ttl in one statement and one
// commit (lease.renew_many): each gets what Renew would answer, and every
// renewed one the same server expiry. The tokens must share one owner and
// name distinct keys; at most MaxBatch. Results come in the order of
// ts. The returned error is for the whole call (invalid input, a
// connection failure, ErrCommitUnknown): then no result is returned. No
// tokens: no call.
func (c *Client) renewMany(ctx context.Context, ts []Token, ttl time.Duration) ([]renewResult, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	if err := checkBatch(ts); err != nil {
		return nil, err
	}
	if err := checkTTL("renew_many", ts[0], "ttl", ttl, false); err != nil {
		return nil, err
	}
	keys := make([]string, len(ts))
	epochs := make([]int64, len(ts))
	for i, t := range ts {
		keys[i], epochs[i] = t.Key, t.Epoch
	}
	type row struct {
		status    string
		expiresAt *time.Time
	}
	var (
		rows      []row
		serverNow time.Time
		sent      time.Time
	)
	err := retryOnce(ctx, func() error {
		return c.onConn(ctx, "renew_many", func() Token { return Token{Owner: ts[0].Owner} }, func(q Querier) error {
			rows = rows[:0]
			sent = c.clock.Now()
			// One statement: clock_timestamp() is read after every row of
			// the function's result, so each decision came before it.
			r, err := q.Query(ctx,
				`SELECT r.status, r.expires_at, clock_timestamp() FROM lease.renew_many($1, $2, $3, $4) r`,
				keys, ts[0].Owner, epochs, ttl)
			if err != nil {
				return err
			}
			defer r.Close()
			for r.Next() {
				var x row
				if err := r.Scan(&x.status, &x.expiresAt, &serverNow); err != nil {
					return err
				}
				rows = append(rows, x)
			}
			return r.Err()
		})
	})
	if err != nil {
		return nil, mapError("renew_many", Token{Owner: ts[0].Owner}, err)
	}
	if len(rows) != len(ts) {
		return nil, fmt.Errorf("lease: renew_many: %d rows from the server for %d keys", len(rows), len(ts))
	}
	out := make([]renewResult, len(ts))
	for i, t := range ts {
		out[i].Token = t
		if err := statusErr("renew", t, rows[i].status); err != nil {
			out[i].Err = err
			continue
		}
		if rows[i].expiresAt == nil {
			return nil, fmt.Errorf("lease: renew_many %q: status ok without an expiry", t.Key)
		}
		out[i].Grant = newGrant(t, *rows[i].expiresAt, ttl, sent, serverNow)
	}
	return out, nil
}

// checkBatch rejects, without a round trip, what the server would reject
// for the batch as a whole: too many tokens, several owners, a repeated key.
func checkBatch(ts []Token) error {
	if len(ts) > MaxBatch {
		return fmt.Errorf("renew_many: %w: %d tokens, at most %d", ErrInvalidInput, len(ts), MaxBatch)
	}
	seen := make(map[string]int, len(ts))
	for i, t := range ts {
		if t.Owner != ts[0].Owner {
			return fmt.Errorf("renew_many: %w: tokens %d and 0 have different owners (%q, %q)",
				ErrInvalidInput, i, t.Owner, ts[0].Owner)
		}
		if j, dup := seen[t.Key]; dup {
			return fmt.Errorf("renew_many: %w: tokens %d and %d name the same key %q", ErrInvalidInput, j, i, t.Key)
		}
		seen[t.Key] = i
	}
	return nil
}

// RenewTerms renews the grants of terms in one statement (lease.renew_many) and applies each
// answer as Term.Renew would: errs[i] is what terms[i].Renew would have
// returned. The terms must share an owner and a TTL and hold distinct keys
// (else every errs[i] matches ErrInvalidInput). The call is bounded by the
// earliest deadline among the live terms. Ended terms are left out of the
// call and get their end's error.
func (c *Client) RenewTerms(ctx context.Context, terms []*Term) []error {
	errs := make([]error, len(terms))
	if len(terms) == 0 {
		return errs
	}
	// Lock every term's renewMu in key order, as Term.Renew locks one.
	order := make([]int, len(terms))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return terms[order[a]].Grant().Key < terms[order[b]].Grant().Key })
	for i, j := range order {
		if i > 0 && terms[order[i-1]] == terms[j] {
			return fill(errs, fmt.Errorf("renew_many: %w: a term appears twice", ErrInvalidInput))
		}
		terms[j].renewMu.Lock()
		defer terms[j].renewMu.Unlock()
	}

	var (
		live     []int
		ts       []Token
		deadline time.Time
	)
	for i, t := range terms {
		if err := t.Err(); err != nil {
			errs[i] = fmt.Errorf("lease: renew %s: term ended: %w", t.grant.Token, err)
			continue
		}
		g := t.Grant()
		if len(ts) > 0 && g.TTL != terms[live[0]].Grant().TTL {
			return fill(errs, fmt.Errorf("renew_many: %w: terms of different TTLs (%v, %v)",
				ErrInvalidInput, g.TTL, terms[live[0]].Grant().TTL))
		}
		if d := t.Deadline(); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
		live = append(live, i)
		ts = append(ts, g.Token)
	}
	if len(live) == 0 {
		return errs
	}
	rctx, cancel := context.WithTimeout(ctx, deadline.Sub(c.clock.Now()))
	defer cancel()
	res, err := c.renewMany(rctx, ts, terms[live[0]].Grant().TTL)
	for k, i := range live {
		t := terms[i]
		switch {
		case err != nil && ctx.Err() == nil && rctx.Err() != nil:
			if !t.Deadline().After(deadline) {
				t.end(ErrLocalDeadline, nil) // the bound of the call was its deadline
			}
			errs[i] = fmt.Errorf("lease: renew %s: %w (%w)", ts[k], ErrLocalDeadline, err)
		case err != nil:
			errs[i] = err
		case errors.Is(res[k].Err, ErrLost):
			t.endLost(res[k].Err)
			errs[i] = res[k].Err
		default:
			errs[i] = t.extend(res[k].Grant)
		}
	}
	return errs
}

func fill(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// RenewTokens renews every grant of ts for ttl in one statement and one
// commit (lease.renew_many), each as Renew would: grants[i] is the renewed
// grant of ts[i] when errs[i] is nil, else errs[i] is Renew's error
// (matching ErrLost). Every renewed grant gets the same server expiry. It
// takes a grant this process holds without a term yet, such as one a
// handover gave it (the notification names its owner and epoch): only a
// grant the server shows held by that owner at that epoch is renewed. The
// returned error is for the whole call; then no result is returned. The
// tokens must share one owner and name distinct keys; at most MaxBatch.
func (c *Client) RenewTokens(ctx context.Context, ts []Token, ttl time.Duration) (grants []Grant, errs []error, err error) {
	res, err := c.renewMany(ctx, ts, ttl)
	if err != nil {
		return nil, nil, err
	}
	grants, errs = make([]Grant, len(ts)), make([]error, len(ts))
	for i, r := range res {
		grants[i], errs[i] = r.Grant, r.Err
	}
	return grants, errs, nil
}

// ReleaseMany releases every grant of ts in one statement and one commit,
// each as Release would (a handover to a candidate included), in byte order
// of the keys (Go's string order; lease.renew_many locks in the same order,
// COLLATE "C", whatever the database's collation), so that concurrent
// batches lock rows in one order. errs[i] is Release's
// answer for ts[i]. The returned error is for the whole call; then no
// result is returned. At most MaxBatch tokens, of distinct keys.
func (c *Client) ReleaseMany(ctx context.Context, ts []Token) ([]error, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	if len(ts) > MaxBatch {
		return nil, fmt.Errorf("release_many: %w: %d tokens, at most %d", ErrInvalidInput, len(ts), MaxBatch)
	}
	order := make([]int, len(ts))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return ts[order[a]].Key < ts[order[b]].Key })
	keys := make([]string, len(ts))
	owners := make([]string, len(ts))
	epochs := make([]int64, len(ts))
	for i, j := range order {
		if i > 0 && ts[order[i-1]].Key == ts[j].Key {
			return nil, fmt.Errorf("release_many: %w: two tokens name the key %q", ErrInvalidInput, ts[j].Key)
		}
		keys[i], owners[i], epochs[i] = ts[j].Key, ts[j].Owner, ts[j].Epoch
	}
	statuses := make([]string, 0, len(ts))
	err := retryOnce(ctx, func() error {
		return c.onConn(ctx, "release_many", func() Token { return ts[0] }, func(q Querier) error {
			statuses = statuses[:0]
			r, err := q.Query(ctx, `SELECT lease.release(u.k, u.o, u.e)
  FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY u(k, o, e, n) ORDER BY u.n`,
				keys, owners, epochs)
			if err != nil {
				return err
			}
			defer r.Close()
			for r.Next() {
				var st string
				if err := r.Scan(&st); err != nil {
					return err
				}
				statuses = append(statuses, st)
			}
			return r.Err()
		})
	})
	if err != nil {
		return nil, mapError("release_many", ts[0], err)
	}
	if len(statuses) != len(ts) {
		return nil, fmt.Errorf("lease: release_many: %d rows from the server for %d keys", len(statuses), len(ts))
	}
	errs := make([]error, len(ts))
	for i, j := range order {
		errs[j] = statusErr("release", ts[j], statuses[i])
	}
	return errs, nil
}

// checkAcquireMany checks a batch of n keys (t names the first) before
// anything is sent: at most MaxBatch keys, a valid ttl.
func checkAcquireMany(t Token, n int, ttl time.Duration) error {
	if n > MaxBatch {
		return fmt.Errorf("acquire_many: %w: %d keys, at most %d", ErrInvalidInput, n, MaxBatch)
	}
	return checkTTL("acquire_many", t, "ttl", ttl, false)
}

// AcquireMany tries once to take every key of keys for owner for ttl, as
// Acquire would each, in one statement and one commit, in byte order of the
// keys (as ReleaseMany) so that concurrent batches lock rows in one order. A key the owner already holds
// answers its grant. grants[i] is keys[i]'s grant, or the zero Grant (epoch
// 0) when another owner holds it; errs[i] is a *GraceError when the grace
// after a promotion denied it. The last error is for the whole call; then
// no result is returned. At most MaxBatch distinct keys.
func (c *Client) AcquireMany(ctx context.Context, keys []string, owner string, ttl time.Duration) (grants []Grant, errs []error, err error) {
	return c.acquireMany(ctx, keys, owner, ttl, time.Time{})
}

// AcquireManyAt is AcquireMany asked at at, an instant on the server's
// clock (a State's or a Grant's ExpiresAt): the statement, sent before,
// waits on the server until its clock shows at (a ttl at most), then tries
// every key. Grants that lapse at at are taken with no round trip after
// they lapse; a grant's ValidUntil counts from the end of the wait. The
// wait holds no lock; it holds the connection. A zero at asks at once. As
// AcquireWait, a wait needs READ COMMITTED: in a transaction of another
// level it returns ErrInvalidIsolation, before waiting and taking nothing.
func (c *Client) AcquireManyAt(ctx context.Context, at time.Time, keys []string, owner string, ttl time.Duration) (grants []Grant, errs []error, err error) {
	return c.acquireMany(ctx, keys, owner, ttl, at)
}

// firstInstant and lastInstant bound the instants AcquireManyAt sends:
// PostgreSQL's first timestamptz (4714-11-24 BC), and the last second whose
// microseconds since 1970 fit an int64 (the binary encoding's arithmetic;
// PostgreSQL's own end, in 294276, is later).
var (
	firstInstant = time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	lastInstant  = time.Unix(math.MaxInt64/1_000_000-1, 0).UTC()
)

// acquireManyAtSQL is acquire_many's statement that first waits for the
// server's clock to show $4 (at most $5 seconds): the wait (w) yields the
// argument of unnest, so every acquire runs after it. w.t0, the server's
// clock read before the wait, bounds the send: a grant is valid from it.
// Outside READ COMMITTED, a wait would leave the acquires the snapshot
// taken before it: lease.acquire with a wait raises invalid_isolation
// (25000) then, before anything is read or changed.
const acquireManyAtSQL = `WITH w AS MATERIALIZED (
  SELECT c.t0 FROM (SELECT pg_catalog.clock_timestamp() AS t0 OFFSET 0) c,
       LATERAL pg_catalog.pg_sleep(CASE
         WHEN $4::timestamptz <= c.t0 OR pg_catalog.current_setting('transaction_isolation') = 'read committed'
         THEN LEAST(GREATEST(extract(epoch FROM $4::timestamptz - c.t0), 0), $5::float8)
         ELSE (SELECT 0 FROM lease.acquire(($1::text[])[1], $2::text, $3::interval, interval '1 microsecond')) END))
SELECT u.k, a.acquired, a.epoch, a.expires_at, (SELECT w.t0 FROM w), pg_catalog.clock_timestamp()
  FROM unnest((SELECT $1::text[] FROM w)) WITH ORDINALITY u(k, n), LATERAL lease.acquire(u.k, $2, $3, interval '0') a
 ORDER BY u.n`

func (c *Client) acquireMany(ctx context.Context, keys []string, owner string, ttl time.Duration, at time.Time) (grants []Grant, errs []error, err error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	t := Token{Key: keys[0], Owner: owner}
	if err := checkAcquireMany(t, len(keys), ttl); err != nil {
		return nil, nil, err
	}
	if !at.IsZero() && (at.Before(firstInstant) || at.After(lastInstant)) {
		return nil, nil, fmt.Errorf("acquire_many %q: %w: at %v is outside the instants PostgreSQL's timestamptz holds and the client sends faithfully (%v to %v)",
			t.Key, ErrInvalidInput, at, firstInstant, lastInstant)
	}
	sorted := append([]string(nil), keys...)
	sort.Strings(sorted) // byte order, as every batch locks
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, nil, fmt.Errorf("acquire_many: %w: the key %q appears twice", ErrInvalidInput, sorted[i])
		}
	}
	type row struct {
		key       string
		acquired  bool
		epoch     *int64
		expiresAt *time.Time
	}
	var (
		rows       []row
		serverNow  time.Time
		began      time.Time // the server's clock before the wait (AcquireManyAt)
		sent, recv time.Time
	)
	err = retryOnce(ctx, func() error {
		return c.onConn(ctx, "acquire_many", func() Token { return t }, func(q Querier) error {
			rows = rows[:0]
			sent = c.clock.Now()
			var r pgx.Rows
			var err error
			if at.IsZero() {
				r, err = q.Query(ctx, `SELECT u.k, a.acquired, a.epoch, a.expires_at, clock_timestamp()
  FROM unnest($1::text[]) WITH ORDINALITY u(k, n), LATERAL lease.acquire(u.k, $2, $3, interval '0') a
 ORDER BY u.n`, sorted, owner, ttl)
			} else {
				r, err = q.Query(ctx, acquireManyAtSQL, sorted, owner, ttl, at, ttl.Seconds())
			}
			if err != nil {
				return err
			}
			defer r.Close()
			for r.Next() {
				var x row
				var err error
				if at.IsZero() {
					err = r.Scan(&x.key, &x.acquired, &x.epoch, &x.expiresAt, &serverNow)
					began = serverNow
				} else {
					err = r.Scan(&x.key, &x.acquired, &x.epoch, &x.expiresAt, &began, &serverNow)
				}
				if err != nil {
					return err
				}
				rows = append(rows, x)
			}
			recv = c.clock.Now()
			return r.Err()
		})
	})
	if err != nil {
		return nil, nil, mapError("acquire_many", t, err)
	}
	if len(rows) != len(keys) {
		return nil, nil, fmt.Errorf("lease: acquire_many: %d rows from the server for %d keys", len(rows), len(keys))
	}
	byKey := make(map[string]int, len(keys))
	for i, k := range keys {
		byKey[k] = i
	}
	grants, errs = make([]Grant, len(keys)), make([]error, len(keys))
	for _, x := range rows {
		i := byKey[x.key]
		switch {
		case x.acquired && x.epoch != nil && x.expiresAt != nil:
			grants[i] = newGrant(Token{Key: x.key, Owner: owner, Epoch: *x.epoch}, *x.expiresAt, ttl, sent, began)
		case !x.acquired && x.expiresAt != nil:
			rt := roundTrip{sent: sent, received: recv, serverNow: serverNow}
			errs[i] = &GraceError{Key: x.key, Until: *x.expiresAt, UntilLocal: rt.latest(*x.expiresAt)}
		}
	}
	return grants, errs, nil
}
