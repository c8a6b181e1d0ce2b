package resourcelock

import (
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// defaultLeaseDuration is the TTL a Lock sends unless Config.LeaseDuration.
const defaultLeaseDuration = 15 * time.Second

// Config is everything New builds a Lock from: the key, the identity, the
// TTL, client-go's timings and the options. Zero fields take their
// defaults; New checks the whole of it once.
type Config struct {
	// Key is the pg_lease key (lease.CheckKey).
	Key string
	// Identity is the owner the lock presents to pg_lease (lease.CheckOwner):
	// unique among the candidates, such as lease.DefaultOwner().
	Identity string
	// LeaseDuration is the TTL sent to the server with every acquire and
	// renew (default 15s; at least 3ms). The record's LeaseDurationSeconds
	// (whole seconds, possibly 0) is never used for it.
	LeaseDuration time.Duration
	// RenewDeadline and RetryPeriod are client-go's timings for an elector
	// on this lock (LeaderElectionConfig fills them in). Default 2/3 and
	// 2/15 of LeaseDuration (10s and 2s for 15s). When either is set, New
	// checks both against Timing's rule; left zero, LeaderElectionConfig
	// does (the defaults break it for a LeaseDuration below about 503ms).
	RenewDeadline, RetryPeriod time.Duration
	// Margin is how long before Grant.ValidUntil a term ends when no
	// renewal moved it: the term margin of lease.CheckMargin (the one
	// margin rule). Default min(LeaseDuration/3, 100ms + LeaseDuration/1000);
	// at least the clock-rate drift floor LeaseDuration/1000, at most
	// LeaseDuration/3.
	Margin time.Duration

	// OnEpochChange, when set, is called synchronously on every change of
	// the epoch under which this lock holds the key: (old, zero Token) when
	// a term ends, after its contexts were cancelled; (zero Token, new) when
	// a term starts, before the Create or Update that obtained it returns
	// and before Token or TokenContext can return it. Calls never overlap
	// and an end is always reported before the next start. It must not call
	// Get, Create or Update, and should return fast.
	OnEpochChange func(old, new lease.Token)
	// Waiter makes a follower's Get wait for news (see the package
	// documentation): the process's listener (one listen.Waiter shared by
	// every lock and elector of the process). Without it, Get returns at
	// once and client-go's followers poll every RetryPeriod.
	Waiter *listen.Waiter
	// EventRecorder, when set, is what RecordEvent records on, about
	// EventObject. A nil EventObject is the coordination.k8s.io/v1 Lease
	// named after the key: a "namespace/name" key is split, any other key
	// is a name in EventNamespace.
	EventRecorder  rl.EventRecorder
	EventObject    runtime.Object
	EventNamespace string
	// Candidacy, when set, registers the lock as a candidate of its key
	// while it follows (every Get renews the registration when due, and a
	// waiting Get renews it inside the wait, when due and as soon as the
	// candidate's readiness changes; the first Get waits too while another
	// identity holds the key), so that the
	// leader's release may hand the key straight to it: the next Get
	// returns a record naming this identity, and client-go's Update takes
	// up the grant. Its Strategy is set on the key.
	Candidacy *handover.Candidacy
}

// FieldError is the complaint about one field of a Config (New) or of a
// client-go LeaderElectionConfig (Timing, Lock.LeaderElectionConfig): Field
// is the field's Go name, and the text of Err names it too. It matches
// lease.ErrInvalidInput.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }

// Is makes every FieldError match lease.ErrInvalidInput: it is bad input.
func (e *FieldError) Is(target error) bool { return target == lease.ErrInvalidInput }

// withDefaults returns c with every zero field set to its default, and
// checks the result: one *FieldError for each offending field.
func (c Config) withDefaults() (Config, []error) {
	var errs []error
	if err := lease.CheckKey(c.Key); err != nil {
		errs = append(errs, &FieldError{"Key", err})
	}
	if err := lease.CheckOwner(c.Identity); err != nil {
		errs = append(errs, &FieldError{"Identity", fmt.Errorf("identity: %w", err)})
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = defaultLeaseDuration
	}
	if m, err := checkTTL(c.LeaseDuration, c.Margin); err != nil {
		errs = append(errs, err)
	} else {
		// Timings left zero are not checked here: a TTL too short for the
		// default proportions still makes a lock (LeaderElectionConfig
		// refuses those defaults, and takes timings that keep the rule).
		given := c.RenewDeadline != 0 || c.RetryPeriod != 0
		t, terrs := timing(c.LeaseDuration, m, leaderelection.LeaderElectionConfig{
			LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod,
		})
		if given {
			errs = append(errs, terrs...)
		}
		c.Margin, c.RenewDeadline, c.RetryPeriod = m, t.RenewDeadline, t.RetryPeriod
	}
	if c.Candidacy != nil {
		if err := c.Candidacy.Check(); err != nil {
			errs = append(errs, &FieldError{"Candidacy", fmt.Errorf("Candidacy: %w", err)})
		}
	}
	return c, errs
}

// LeaderElectionConfig checks, and completes, a client-go
// LeaderElectionConfig for this lock. It sets Lock when nil; a Lock that is
// set must be this lock. Zero timings are the lock's (Config.RenewDeadline
// and RetryPeriod; LeaseDuration = the lock's TTL), and all follow Timing
// with the lock's lease duration and margin. The error joins one
// *FieldError for each offending field.
func (l *Lock) LeaderElectionConfig(cfg leaderelection.LeaderElectionConfig) (leaderelection.LeaderElectionConfig, error) {
	var errs []error
	switch {
	case cfg.Lock == nil:
		cfg.Lock = l
	case cfg.Lock != l:
		errs = append(errs, &FieldError{"Lock", fmt.Errorf("Lock: is %s, not this lock (%s)", cfg.Lock.Describe(), l.Describe())})
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = l.cfg.RenewDeadline
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = l.cfg.RetryPeriod
	}
	cfg, terrs := timing(l.cfg.LeaseDuration, l.cfg.Margin, cfg)
	if errs = append(errs, terrs...); len(errs) > 0 {
		return cfg, fmt.Errorf("resourcelock: LeaderElectionConfig for %s: %w", l.Describe(), errors.Join(errs...))
	}
	return cfg, nil
}

// Timing is the timing rule of every pg_lease lock, for a lock whose lease
// duration (the TTL sent to the server) is ttl and whose margin is margin
// (0: lease.CheckMargin's default). It is a pure function: New and
// Lock.LeaderElectionConfig apply it. It fills zero timings of cfg in
// client-go's proportions of ttl: LeaseDuration = ttl, RenewDeadline = 2/3
// and RetryPeriod = 2/15 of it (15s/10s/2s for 15s). Its error joins one
// *FieldError for each offence:
//
//   - the TTL or margin that lease.CheckMargin refuses (Field LeaseDuration
//     or Margin; nothing else is then checked);
//   - client-go's own rules, which NewLeaderElector enforces and RunOrDie
//     panics on: LeaseDuration > RenewDeadline > JitterFactor × RetryPeriod > 0;
//   - RenewDeadline + RetryPeriod below ttl minus the margin (Field
//     RenewDeadline). client-go's leader context ends only after a renewal
//     round of RenewDeadline has failed, and that round starts RetryPeriod
//     after the last success. With a longer sum the context outlives the
//     grant on the server.
//
// client-go's LeaseDuration only times followers (the server decides every
// expiry with ttl), so it may differ from ttl. cfg.Lock is not looked at.
func Timing(ttl, margin time.Duration, cfg leaderelection.LeaderElectionConfig) (leaderelection.LeaderElectionConfig, error) {
	margin, err := checkTTL(ttl, margin)
	if err != nil {
		return cfg, err
	}
	cfg, errs := timing(ttl, margin, cfg)
	return cfg, errors.Join(errs...)
}

// timing is Timing's rule for a TTL and margin that checkTTL accepted, with
// its offences listed.
func timing(ttl, margin time.Duration, cfg leaderelection.LeaderElectionConfig) (leaderelection.LeaderElectionConfig, []error) {
	var errs []error
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = ttl
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = part(ttl, 2, 3)
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = part(ttl, 2, 15)
	}
	if cfg.RetryPeriod <= 0 {
		errs = append(errs, &FieldError{"RetryPeriod", fmt.Errorf("RetryPeriod (%v) must be positive", cfg.RetryPeriod)})
	}
	if jit := time.Duration(leaderelection.JitterFactor * float64(cfg.RetryPeriod)); cfg.RenewDeadline <= jit {
		errs = append(errs, &FieldError{"RenewDeadline", fmt.Errorf("RenewDeadline (%v) must be greater than RetryPeriod (%v) x JitterFactor %v = %v",
			cfg.RenewDeadline, cfg.RetryPeriod, leaderelection.JitterFactor, jit)})
	}
	if cfg.LeaseDuration <= cfg.RenewDeadline {
		errs = append(errs, &FieldError{"LeaseDuration", fmt.Errorf("LeaseDuration (%v) must be greater than RenewDeadline (%v)",
			cfg.LeaseDuration, cfg.RenewDeadline)})
	}
	if limit := ttl - margin; cfg.RetryPeriod > 0 && cfg.RenewDeadline >= limit-cfg.RetryPeriod {
		errs = append(errs, &FieldError{"RenewDeadline", fmt.Errorf("RenewDeadline (%v) + RetryPeriod (%v) = %v must be below the lock's lease duration (%v) minus its margin (%v) = %v: "+
			"client-go's leader context would outlive the grant", cfg.RenewDeadline, cfg.RetryPeriod,
			cfg.RenewDeadline+cfg.RetryPeriod, ttl, margin, limit)})
	}
	return cfg, errs
}

// part is d*n/k for a positive d without overflowing time.Duration (n < k).
func part(d time.Duration, n, k time.Duration) time.Duration {
	return d/k*n + d%k*n/k
}

// checkTTL applies lease.CheckMargin to a lock's lease duration and margin
// (0: the default) and returns the margin to use. Its error is a
// *FieldError for LeaseDuration or Margin.
func checkTTL(ttl, margin time.Duration) (time.Duration, error) {
	m, err := lease.CheckMargin(ttl, margin)
	if err == nil {
		return m, nil
	}
	if _, terr := lease.CheckMargin(ttl, 0); terr != nil {
		return 0, &FieldError{"LeaseDuration", fmt.Errorf("LeaseDuration: %w", terr)}
	}
	return 0, &FieldError{"Margin", fmt.Errorf("Margin: %w", err)}
}
