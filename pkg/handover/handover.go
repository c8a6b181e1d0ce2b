package handover

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Strategy says which registered candidate a release hands a key to
// (lease.Strategy).
type Strategy = lease.Strategy

// The strategies. Under StrategyAny (the default) a release frees the key and
// the waiters race, as without candidates.
const (
	StrategyAny           = lease.StrategyAny
	StrategyPriority      = lease.StrategyPriority
	StrategyNewestVersion = lease.StrategyNewestVersion
	StrategyOldestVersion = lease.StrategyOldestVersion
)

// ErrTooMany: the role reached the server's bound on candidate registrations
// or on keys with a strategy (SQLSTATE 54000). It is lease.ErrTooMany.
var ErrTooMany = lease.ErrTooMany

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
type Candidate = lease.Candidate

// CandidateState is one registration as lease.candidates reports it.
type CandidateState = lease.CandidateState

// Register is lease.Client.RegisterCandidate.
func Register(ctx context.Context, c *lease.Client, key string, cand Candidate) (time.Time, error) {
	return c.RegisterCandidate(ctx, key, cand)
}

// Withdraw is lease.Client.WithdrawCandidate.
func Withdraw(ctx context.Context, c *lease.Client, key, owner string) (bool, error) {
	return c.WithdrawCandidate(ctx, key, owner)
}

// SetStrategy is lease.Client.SetStrategy.
func SetStrategy(ctx context.Context, c *lease.Client, key string, s Strategy) (Strategy, error) {
	return c.SetStrategy(ctx, key, s)
}

// Candidates is lease.Client.Candidates.
func Candidates(ctx context.Context, c *lease.Client, key string) (Strategy, []CandidateState, error) {
	return c.Candidates(ctx, key)
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

// RegisterMany is lease.Client.RegisterCandidates.
func RegisterMany(ctx context.Context, c *lease.Client, keys []string, priorities []int32, cand Candidate) ([]string, error) {
	return c.RegisterCandidates(ctx, keys, priorities, cand)
}

// WithdrawMany is lease.Client.WithdrawCandidates.
func WithdrawMany(ctx context.Context, c *lease.Client, keys []string, owner string) error {
	return c.WithdrawCandidates(ctx, keys, owner)
}

// SetStrategyMany is lease.Client.SetStrategies.
func SetStrategyMany(ctx context.Context, c *lease.Client, keys []string, s Strategy) error {
	return c.SetStrategies(ctx, keys, s)
}
