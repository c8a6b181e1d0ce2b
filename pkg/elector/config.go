package elector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// Defaults. Every default is filled in one place, Config.withDefaults.
const (
	// defaultTTL is the lease duration asked of the server on every acquire
	// and renewal.
	defaultTTL = 15 * time.Second
)

// ErrInvalidConfig matches every error New returns for a Config field.
var ErrInvalidConfig = errors.New("elector: invalid config")

// Callbacks are called by Run. None of them may be called concurrently with
// another of the same elector except OnStartedLeading, which runs in a
// goroutine of its own.
type Callbacks struct {
	// OnStartedLeading is called in a new goroutine when a term starts,
	// with the leader context: it carries the term's fencing token
	// (lease.TokenFromContext) and is cancelled when the term ends: before
	// the grant's local deadline when renewals stop succeeding, at once
	// when the server says the grant was lost, and when Run's context ends.
	// It must return promptly once its context is cancelled: the next term
	// (in this process) starts, and a release hands the lease to another
	// candidate, only after it has returned. Returning while the term is
	// still valid resigns: the lease is released and Run campaigns again
	// after RetryInterval. Required.
	OnStartedLeading func(ctx context.Context)

	// OnStoppedLeading is called, on Run's goroutine, after every term,
	// once OnStartedLeading has returned and the lease was released (if it
	// was). Optional.
	OnStoppedLeading func()

	// OnNewLeader is called, on Run's goroutine, whenever the observed
	// holder of the key changes (another identity, or another epoch of the
	// same one), this elector included. identity is the holder's owner
	// string, which is not authenticated: it may be this elector's own
	// while another session holds the key (Status.IdentityTaken). Only
	// OnStartedLeading means this elector leads. It must not block: it
	// delays campaigning and the start of a term. Optional.
	OnNewLeader func(identity string, epoch int64)
}

// Config configures an Elector. Zero fields take the defaults stated on
// each; New validates the whole Config once.
type Config struct {
	// Key is the lease key that candidates compete for. Required.
	Key string

	// Identity is this candidate's owner name in the lease. It must be
	// unique per process incarnation: two live processes with the same
	// identity under the same database role share a grant (lease.acquire
	// is idempotent for its holder). Owner strings are public and not
	// authenticated: a grant under this identity taken by another role is
	// refused to this elector, which then follows it as another holder's
	// (Status.IdentityTaken, the identity_taken error kind, a log line at
	// most once a minute). Default: "<hostname>-<pid>-<8 random hex
	// digits>".
	Identity string

	// TTL is the lease duration requested on every acquire and renewal.
	// Default 15s.
	TTL time.Duration

	// RenewInterval is the pause between successful renewals. At most
	// TTL/3, so that at least two more attempts fit in a grant's trust
	// window after a failure. Default TTL/3.
	RenewInterval time.Duration

	// RetryInterval is the pause after a failed acquire, inspect or renew
	// before the next attempt, and a follower's poll interval when there
	// is no Waiter. At most RenewInterval. Default RenewInterval/2.
	RetryInterval time.Duration

	// Margin is how long before a grant's local validity end
	// (Grant.ValidUntil) the leader context is cancelled: the margin of the
	// term (lease.CheckMargin, the one margin rule). It must cover the
	// clock-rate drift over one grant (at least TTL/1000) and the
	// scheduling delay of the code that observes the cancellation; at most
	// TTL/3. Default min(TTL/3, 100ms + TTL/1000).
	Margin time.Duration

	// HealthTolerance is how long past the local deadline Check tolerates a
	// term whose OnStartedLeading has not yet returned. Default
	// RenewInterval.
	HealthTolerance time.Duration

	// Waiter, the process's listener, wakes followers when the key is
	// released (listen.Await). Nil: followers poll every
	// RetryInterval, and wake at the observed grant's expiry either way.
	Waiter *listen.Waiter

	// Candidacy, when set, registers this elector as a candidate of Key
	// while it follows (handover.Candidacy), so that a leader's release may
	// hand the key straight to it; its Strategy is set on the key. Nil: no
	// registration, and a release frees the key for the race.
	Candidacy *handover.Candidacy

	Callbacks Callbacks

	// Logger receives state changes (Info) and failed calls (Error).
	// Default: discard.
	Logger logr.Logger

	// Registerer is where New registers the elector's Prometheus metrics,
	// labelled by lease key (nil: they are kept but not registered
	// anywhere); pass controller-runtime's metrics.Registry to serve them
	// beside a manager's:
	//
	//	pg_lease_elector_leader{key}                       1 while this process leads, else 0
	//	pg_lease_elector_epoch{key}                        epoch of the term this process leads, 0 when not leading
	//	pg_lease_elector_renew_duration_seconds{key}       latency of every renew call, successful or not
	//	pg_lease_elector_transitions_total{key,transition} "started" and "stopped" terms
	//	pg_lease_elector_errors_total{key,kind}            failures by kind (acquire, inspect, renew, release, register,
	//	                                                   lapsed, not_owner, epoch_mismatch, deadline, identity_taken)
	//
	// Several electors may share one Registerer: the collectors one
	// registered are reused by the next. Electors sharing one must have
	// distinct keys.
	Registerer prometheus.Registerer
}

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
}

// withDefaults returns c with every zero field set to its default, and
// validates the result.
func (c Config) withDefaults() (Config, error) {
	if err := lease.CheckKey(c.Key); err != nil {
		return c, configErr("Key", "%v", err)
	}
	if c.Identity == "" {
		c.Identity = lease.DefaultOwner()
	}
	if err := lease.CheckOwner(c.Identity); err != nil {
		return c, configErr("Identity", "%v", err)
	}
	if c.TTL == 0 {
		c.TTL = defaultTTL
	}
	if _, err := lease.CheckMargin(c.TTL, 0); err != nil {
		return c, configErr("TTL", "%v", err)
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = lease.RenewInterval(c.TTL)
	}
	if c.RenewInterval < 0 || c.RenewInterval > lease.RenewInterval(c.TTL) {
		return c, configErr("RenewInterval", "must be positive and at most TTL/3 (%v), got %v", lease.RenewInterval(c.TTL), c.RenewInterval)
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = c.RenewInterval / 2
	}
	if c.RetryInterval < 0 || c.RetryInterval > c.RenewInterval {
		return c, configErr("RetryInterval", "must be positive and at most RenewInterval (%v), got %v", c.RenewInterval, c.RetryInterval)
	}
	m, err := lease.CheckMargin(c.TTL, c.Margin)
	if err != nil {
		return c, configErr("Margin", "%v", err)
	}
	c.Margin = m
	if c.HealthTolerance == 0 {
		c.HealthTolerance = c.RenewInterval
	}
	if c.HealthTolerance < 0 {
		return c, configErr("HealthTolerance", "must not be negative, got %v", c.HealthTolerance)
	}
	if c.Candidacy != nil {
		if err := c.Candidacy.Check(); err != nil {
			return c, configErr("Candidacy", "%v", err)
		}
	}
	if c.Callbacks.OnStartedLeading == nil {
		return c, configErr("Callbacks.OnStartedLeading", "is required")
	}
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
	return c, nil
}
