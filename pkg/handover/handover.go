package handover

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pg_lease/pkg/internal/leasecore"
	"github.com/pglease/pg_lease/pkg/lease"
)

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

// ParseStrategy returns the Strategy named s ("any", "priority",
// "newest_version", "oldest_version"; "-" may stand for "_").
func ParseStrategy(s string) (Strategy, error) {
	b := []byte(s)
	for i, c := range b {
		if c == '-' {
			b[i] = '_'
		}
	}
	switch st := Strategy(b); st {
	case StrategyAny, StrategyPriority, StrategyNewestVersion, StrategyOldestVersion:
		return st, nil
	}
	return "", fmt.Errorf("handover: %w: strategy %q is not one of any, priority, newest-version, oldest-version", lease.ErrInvalidInput, s)
}

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

// candidateError is lease's error mapping, with the server's bound on
// registrations (SQLSTATE 54000) as ErrTooMany.
func candidateError(op, key, owner string, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "54000" {
		return leasecore.ServerError(op, ErrTooMany, pg)
	}
	return leasecore.MapError(op, key, owner, err)
}

// Register registers (or renews) cand as a candidate of key until the server
// time it returns. The registration also ends when the connection that made
// it closes. It is the registration of the connection's database role:
// from pg_lease 0.5.0 another role's registration of the same owner is
// another registration, which neither refuses nor replaces it (0.4.0 failed
// with lease.ErrNotOwner while that one was live).
func Register(ctx context.Context, c *lease.Client, key string, cand Candidate) (time.Time, error) {
	if err := leasecore.CheckTTL("register", key, "ttl", cand.TTL, false); err != nil {
		return time.Time{}, err
	}
	var version *string
	if cand.Version != "" {
		version = &cand.Version
	}
	var (
		status    string
		expiresAt *time.Time
	)
	err := leasecore.RetryOnce(ctx, func() error {
		return leasecore.DB(c).QueryRow(ctx, leasecore.RegisterSQL,
			key, cand.Owner, cand.TTL, version, cand.Priority, cand.Ready).Scan(&status, &expiresAt)
	})
	if err != nil {
		return time.Time{}, candidateError("register", key, cand.Owner, err)
	}
	if status != "ok" {
		return time.Time{}, leasecore.StatusErr("register", key, cand.Owner, 0, status)
	}
	return *expiresAt, nil
}

// Withdraw ends owner's registrations for key made by the connection's
// database role (or a role it is a member of); false when there was none.
// Another role's registration of the same owner stays.
func Withdraw(ctx context.Context, c *lease.Client, key, owner string) (bool, error) {
	var ok bool
	err := leasecore.RetryOnce(ctx, func() error {
		return leasecore.DB(c).QueryRow(ctx, `SELECT lease.withdraw($1, $2)`, key, owner).Scan(&ok)
	})
	if err != nil {
		return false, leasecore.MapError("withdraw", key, owner, err)
	}
	return ok, nil
}

// SetStrategy sets the strategy of the connection's database role for key
// and returns that role's strategy before. It governs only the releases
// made by that role; another role's strategy of the key neither refuses
// nor overrides it (pg_lease 0.4.0 kept one strategy per key, and another
// role than the one that set it got lease.ErrPermission).
func SetStrategy(ctx context.Context, c *lease.Client, key string, s Strategy) (Strategy, error) {
	var prev string
	err := leasecore.RetryOnce(ctx, func() error {
		return leasecore.DB(c).QueryRow(ctx, leasecore.SetStrategySQL, key, string(s)).Scan(&prev)
	})
	if err != nil {
		return "", candidateError("set strategy", key, "", err)
	}
	return Strategy(prev), nil
}

// Candidates returns the strategy of the connection's database role for
// key and the key's registrations (every role's: owners are public, roles
// are not shown), in the order a release by that role would choose them.
func Candidates(ctx context.Context, c *lease.Client, key string) (Strategy, []CandidateState, error) {
	db := leasecore.DB(c)
	rows, err := db.Query(ctx,
		`SELECT c.strategy, c.owner, c.version, c.priority, c.ready, c.live, c.rank, c.registered_at, c.expires_at
		   FROM lease.candidates($1) c`, key)
	if err != nil {
		return "", nil, leasecore.MapError("candidates", key, "", err)
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
			return "", nil, leasecore.MapError("candidates", key, "", err)
		}
		strategy = Strategy(st)
		if version != nil {
			cs.Version = *version
		}
		if rank != nil {
			cs.Rank = *rank
		}
		out = append(out, cs)
	}
	if err := rows.Err(); err != nil {
		return "", nil, leasecore.MapError("candidates", key, "", err)
	}
	if len(out) == 0 {
		// No registration: read the strategy alone.
		var st string
		if err := db.QueryRow(ctx, `SELECT lease.strategy($1)`, key).Scan(&st); err != nil {
			return "", nil, leasecore.MapError("candidates", key, "", err)
		}
		strategy = Strategy(st)
	}
	return strategy, out, nil
}

// Candidacy is how an elector or a lock takes part in handovers: while it
// follows, it keeps itself registered as a candidate of its key
// (Register, renewed every third of the TTL), and a release by the
// leader may grant it the key directly.
type Candidacy struct {
	// Strategy, when set, is set on the key at the first registration
	// (lease.set_strategy): the strategy of the database role, which
	// governs the releases of every process of that role. Empty leaves it
	// as it is.
	Strategy Strategy
	// Version is this candidate's semantic version (empty: none).
	Version string
	// Priority orders candidates under StrategyPriority (higher first).
	Priority int32
	// Ready reports whether this candidate may be chosen now (for example
	// once its caches are synced). Nil: always ready.
	Ready func() bool
}

// versionPattern is the server's version rule (lease._version_parts): an
// optional v, one to three numbers, an optional pre-release and build, with
// surrounding white space.
var versionPattern = regexp.MustCompile(`^[ \t\n\v\f\r]*[vV]?[0-9]{1,30}(?:\.[0-9]{1,30})?(?:\.[0-9]{1,30})?` +
	`(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?[ \t\n\v\f\r]*$`)

// maxVersion is the longest version the server accepts, in bytes.
const maxVersion = 256

// CheckVersion applies the server's rule for a candidate's version before
// anything is sent: a semantic version such as 1.31.0 or v1.31.0-rc.1, at
// most 256 bytes. The empty string (no version) passes. The error matches
// lease.ErrInvalidInput.
func CheckVersion(v string) error {
	switch {
	case v == "":
		return nil
	case len(v) > maxVersion:
		return fmt.Errorf("%w: version must be at most %d bytes, got %d", lease.ErrInvalidInput, maxVersion, len(v))
	case !versionPattern.MatchString(v):
		return fmt.Errorf("%w: version %q is not a semantic version such as 1.31.0 or v1.31.0-rc.1", lease.ErrInvalidInput, v)
	}
	return nil
}

// Check validates the candidacy's strategy and version (CheckVersion), so
// that an elector or a lock refuses a bad one when it is built: a
// follower's registration errors cost only its handover, and go unseen.
func (c Candidacy) Check() error {
	if c.Strategy != "" {
		if _, err := ParseStrategy(string(c.Strategy)); err != nil {
			return err
		}
	}
	return CheckVersion(c.Version)
}

// RegisterMany registers (or renews) owner as a candidate of every key of
// keys in one statement, key i with priorities[i]; the TTL, version and
// readiness are cand's (cand.Priority is not used). At most lease.MaxBatch
// keys. It returns the keys whose registration the server refused (pg_lease
// 0.4.0 only: another role registered owner for them); an error is for the
// whole call.
func RegisterMany(ctx context.Context, c *lease.Client, keys []string, priorities []int32, cand Candidate) ([]string, error) {
	if len(keys) != len(priorities) || len(keys) > lease.MaxBatch {
		return nil, fmt.Errorf("handover: register_many: %w: %d keys and %d priorities (at most %d keys)",
			lease.ErrInvalidInput, len(keys), len(priorities), lease.MaxBatch)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if err := leasecore.CheckTTL("register_many", "", "ttl", cand.TTL, false); err != nil {
		return nil, err
	}
	var version *string
	if cand.Version != "" {
		version = &cand.Version
	}
	var refused []string
	err := leasecore.RetryOnce(ctx, func() error {
		refused = refused[:0]
		rows, err := leasecore.DB(c).Query(ctx, `
SELECT u.k FROM unnest($1::text[], $2::int[]) u(k, p),
       LATERAL lease.candidate(u.k, $3, $4, $5, u.p, $6) r
 WHERE r.status <> 'ok'`, keys, priorities, cand.Owner, cand.TTL, version, cand.Ready)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return err
			}
			refused = append(refused, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, candidateError("register_many", "", cand.Owner, err)
	}
	return refused, nil
}

// WithdrawMany ends owner's registrations for keys in one statement.
func WithdrawMany(ctx context.Context, c *lease.Client, keys []string, owner string) error {
	if len(keys) == 0 {
		return nil
	}
	err := leasecore.RetryOnce(ctx, func() error {
		_, err := leasecore.DB(c).Exec(ctx, `SELECT lease.withdraw(k, $2) FROM unnest($1::text[]) k`, keys, owner)
		return err
	})
	if err != nil {
		return leasecore.MapError("withdraw_many", "", owner, err)
	}
	return nil
}

// SetStrategyMany sets s as the connection's database role's strategy of
// every key of keys in one statement. It fails as a whole, setting nothing,
// when one key's strategy cannot be set (ErrTooMany; with pg_lease 0.4.0
// also lease.ErrPermission: another role set it).
func SetStrategyMany(ctx context.Context, c *lease.Client, keys []string, s Strategy) error {
	if len(keys) == 0 {
		return nil
	}
	err := leasecore.RetryOnce(ctx, func() error {
		_, err := leasecore.DB(c).Exec(ctx, `SELECT lease.set_strategy(k, $2) FROM unnest($1::text[]) k`, keys, string(s))
		return err
	})
	if err != nil {
		return candidateError("set strategy", "", "", err)
	}
	return nil
}
