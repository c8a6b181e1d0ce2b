package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Candidates and strategies: a release hands a key to a registered
// candidate, decided in the release's own transaction (lease.release). The
// calls are this package's; pkg/handover names them for electors and locks.

// Strategy says which registered candidate a release hands a key to
// (lease.set_strategy). Each database role sets its own strategy of a key,
// which governs only that role's releases: the release grants the key to the
// chosen ready candidate of a role the releasing role may act as (itself, or
// a role it is a member of), epoch + 1, in its own transaction.
type Strategy string

// The strategies. Under StrategyAny (the default) a release frees the key and
// the waiters race, as without candidates.
const (
	StrategyAny Strategy = "any"
	// StrategyPriority: the highest Priority, then the earliest registration.
	StrategyPriority Strategy = "priority"
	// StrategyNewestVersion: the highest semantic Version, then the earliest
	// registration. Candidates without a version are never chosen.
	StrategyNewestVersion Strategy = "newest_version"
	// StrategyOldestVersion: the lowest semantic Version, then the earliest
	// registration (Kubernetes' OldestEmulationVersion).
	StrategyOldestVersion Strategy = "oldest_version"
)

// ErrTooMany: the role reached the server's bound on candidate registrations
// or on keys with a strategy (SQLSTATE 54000).
var ErrTooMany = errors.New("handover: too many registrations for this role")

// Candidate is a registration of Owner as a candidate of a key.
type Candidate struct {
	Owner string
	// Version is a semantic version (1.31.0, v1.31.0-rc.1); empty: none.
	Version string
	// Priority orders candidates under StrategyPriority (higher first).
	Priority int32
	// Ready: only ready candidates are chosen (for example once caches are synced).
	Ready bool
	// TTL is how long the registration lasts unless renewed, and how long
	// a grant handed to the candidate lasts.
	TTL time.Duration
}

// CandidateState is one registration as lease.candidates reports it.
type CandidateState struct {
	Owner    string
	Version  string
	Priority int32
	Ready    bool
	// Live: registered within its TTL, its connection open, its role existing.
	Live bool
	// Rank is the order in which a release by the caller's role would
	// choose it under that role's strategy (1 first); 0 when such a
	// release cannot choose it now (the strategy is any, or the candidate
	// is not live or not ready, or belongs to a role the caller may not
	// act as).
	Rank         int64
	RegisteredAt time.Time
	ExpiresAt    time.Time
}

// The candidate statements, shared with WarmConn: pgx prepares a statement
// per text, so both send the same text.
const (
	// registerSQL registers a candidate: key, owner, ttl, version, priority, ready.
	registerSQL = `SELECT r.status, r.expires_at FROM lease.candidate($1, $2, $3, $4, $5, $6) r`
	// setStrategySQL sets a key's strategy and returns the one before.
	setStrategySQL = `SELECT lease.set_strategy($1, $2)`
)

// candidateError is mapError, with the server's bound on registrations
// (SQLSTATE 54000) as ErrTooMany.
func candidateError(op string, t Token, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "54000" {
		return &serverError{op: op, kind: ErrTooMany, pg: pg}
	}
	return mapError(op, t, err)
}

func versionArg(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}

// RegisterCandidate registers (or renews) cand as a candidate of key until
// the server time it returns. The registration also ends when the
// connection that made it closes. It is the registration of the
// connection's database role: from pg_lease 0.5.0 another role's
// registration of the same owner is another registration, which neither
// refuses nor replaces it (0.4.0 failed with ErrNotOwner while that one
// was live).
func (c *Client) RegisterCandidate(ctx context.Context, key string, cand Candidate) (time.Time, error) {
	t := Token{Key: key, Owner: cand.Owner}
	if err := checkTTL("register", t, "ttl", cand.TTL, false); err != nil {
		return time.Time{}, err
	}
	var (
		status    string
		expiresAt *time.Time
	)
	err := retryOnce(ctx, func() error {
		return c.db.QueryRow(ctx, registerSQL,
			key, cand.Owner, cand.TTL, versionArg(cand.Version), cand.Priority, cand.Ready).Scan(&status, &expiresAt)
	})
	if err != nil {
		return time.Time{}, candidateError("register", t, err)
	}
	if err := statusErr("register", t, status); err != nil {
		return time.Time{}, err
	}
	return *expiresAt, nil
}

// WithdrawCandidate ends owner's registrations for key made by the
// connection's database role (or a role it is a member of); false when
// there was none. Another role's registration of the same owner stays.
func (c *Client) WithdrawCandidate(ctx context.Context, key, owner string) (bool, error) {
	var ok bool
	err := retryOnce(ctx, func() error {
		return c.db.QueryRow(ctx, `SELECT lease.withdraw($1, $2)`, key, owner).Scan(&ok)
	})
	if err != nil {
		return false, mapError("withdraw", Token{Key: key, Owner: owner}, err)
	}
	return ok, nil
}

// SetStrategy sets the strategy of the connection's database role for key
// and returns that role's strategy before. It governs only the releases
// made by that role; another role's strategy of the key neither refuses
// nor overrides it (pg_lease 0.4.0 kept one strategy per key, and another
// role than the one that set it got ErrPermission).
func (c *Client) SetStrategy(ctx context.Context, key string, s Strategy) (Strategy, error) {
	var prev string
	err := retryOnce(ctx, func() error {
		return c.db.QueryRow(ctx, setStrategySQL, key, string(s)).Scan(&prev)
	})
	if err != nil {
		return "", candidateError("set strategy", Token{Key: key}, err)
	}
	return Strategy(prev), nil
}

// Candidates returns the strategy of the connection's database role for
// key and the key's registrations (every role's: owners are public, roles
// are not shown), in the order a release by that role would choose them.
func (c *Client) Candidates(ctx context.Context, key string) (Strategy, []CandidateState, error) {
	t := Token{Key: key}
	rows, err := c.db.Query(ctx,
		`SELECT c.strategy, c.owner, c.version, c.priority, c.ready, c.live, c.rank, c.registered_at, c.expires_at
		   FROM lease.candidates($1) c`, key)
	if err != nil {
		return "", nil, mapError("candidates", t, err)
	}
	defer rows.Close()
	strategy := StrategyAny
	var out []CandidateState
	for rows.Next() {
		var (
			cs      CandidateState
			st      string
			version *string
			rank    *int64
		)
		if err := rows.Scan(&st, &cs.Owner, &version, &cs.Priority, &cs.Ready, &cs.Live, &rank,
			&cs.RegisteredAt, &cs.ExpiresAt); err != nil {
			return "", nil, mapError("candidates", t, err)
		}
		strategy = Strategy(st)
		cs.Version, cs.Rank = deref(version), deref(rank)
		out = append(out, cs)
	}
	if err := rows.Err(); err != nil {
		return "", nil, mapError("candidates", t, err)
	}
	if len(out) == 0 {
		// No registration: read the strategy alone.
		var st string
		if err := c.db.QueryRow(ctx, `SELECT lease.strategy($1)`, key).Scan(&st); err != nil {
			return "", nil, mapError("candidates", t, err)
		}
		strategy = Strategy(st)
	}
	return strategy, out, nil
}

// RegisterCandidates registers (or renews) owner as a candidate of every
// key of keys in one statement, key i with priorities[i], taken in byte
// order of the keys; the TTL, version and readiness are cand's
// (cand.Priority is not used). At most MaxBatch keys. It returns the keys
// whose registration the server refused (pg_lease 0.4.0 only: another role
// registered owner for them); an error is for the whole call.
func (c *Client) RegisterCandidates(ctx context.Context, keys []string, priorities []int32, cand Candidate) ([]string, error) {
	if len(keys) != len(priorities) || len(keys) > MaxBatch {
		return nil, fmt.Errorf("handover: register_many: %w: %d keys and %d priorities (at most %d keys)",
			ErrInvalidInput, len(keys), len(priorities), MaxBatch)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	t := Token{Owner: cand.Owner}
	if err := checkTTL("register_many", t, "ttl", cand.TTL, false); err != nil {
		return nil, err
	}
	keys, priorities = byKey(keys, priorities)
	var refused []string
	err := retryOnce(ctx, func() error {
		refused = refused[:0]
		rows, err := c.db.Query(ctx, `
SELECT u.k FROM unnest($1::text[], $2::int[]) u(k, p),
       LATERAL lease.candidate(u.k, $3, $4, $5, u.p, $6) r
 WHERE r.status <> 'ok'`, keys, priorities, cand.Owner, cand.TTL, versionArg(cand.Version), cand.Ready)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			refused = append(refused, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, candidateError("register_many", t, err)
	}
	return refused, nil
}

// WithdrawCandidates ends owner's registrations for keys in one statement,
// taken in byte order of the keys.
func (c *Client) WithdrawCandidates(ctx context.Context, keys []string, owner string) error {
	if len(keys) == 0 {
		return nil
	}
	keys, _ = byKey(keys, nil)
	err := retryOnce(ctx, func() error {
		_, err := c.db.Exec(ctx, `SELECT lease.withdraw(k, $2) FROM unnest($1::text[]) k`, keys, owner)
		return err
	})
	if err != nil {
		return mapError("withdraw_many", Token{Owner: owner}, err)
	}
	return nil
}

// SetStrategies sets s as the connection's database role's strategy of
// every key of keys in one statement. It fails as a whole, setting nothing,
// when one key's strategy cannot be set (ErrTooMany; with pg_lease 0.4.0
// also ErrPermission: another role set it). The keys are taken in byte
// order.
func (c *Client) SetStrategies(ctx context.Context, keys []string, s Strategy) error {
	if len(keys) == 0 {
		return nil
	}
	keys, _ = byKey(keys, nil)
	err := retryOnce(ctx, func() error {
		_, err := c.db.Exec(ctx, `SELECT lease.set_strategy(k, $2) FROM unnest($1::text[]) k`, keys, string(s))
		return err
	})
	if err != nil {
		return candidateError("set strategy", Token{}, err)
	}
	return nil
}

// byKey returns keys sorted in byte order, and prios (when not nil) along,
// as copies: the batch calls take their keys' rows in that order (as
// acquire_many and release_many do on the server), so two callers whose
// key sets overlap wait for each other at most once instead of each
// holding a row the other asks for next.
func byKey(keys []string, prios []int32) ([]string, []int32) {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	ks := make([]string, len(keys))
	var ps []int32
	if prios != nil {
		ps = make([]int32, len(prios))
	}
	for i, j := range idx {
		ks[i] = keys[j]
		if prios != nil {
			ps[i] = prios[j]
		}
	}
	return ks, ps
}
