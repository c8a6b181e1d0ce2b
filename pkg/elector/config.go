package elector

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
)

// Defaults. Every default is filled in one place, Config.withDefaults.
const (
	// DefaultTTL is the lease duration asked of the server on every acquire
	// and renewal.
	DefaultTTL = 15 * time.Second

	// SchedulingMargin is the fixed part of the default Margin: the time
	// between the local deadline and the moment the code acting under the
	// leader context can be expected to have observed its cancellation
	// (timer latency, goroutine scheduling on a loaded host, a garbage
	// collection pause, a write already in flight).
	SchedulingMargin = 100 * time.Millisecond

	// MaxClockRateDrift is the relative rate difference between this
	// process's monotonic clock and the server's clock that Margin must
	// cover: 1000 ppm, twice the 500 ppm that NTP (and chrony by default)
	// may slew a clock, and far above the drift of a quartz oscillator
	// (tens of ppm). Over a window of TTL it accounts for TTL/1000.
	MaxClockRateDrift = 1e-3
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
	// same one), this elector included. It must not block: it delays
	// campaigning and the start of a term. Optional.
	OnNewLeader func(identity string, epoch int64)
}

// Waiter blocks a follower until the key may have become free. Wait must
// return nil when key was released (or force-released), when the local
// instant until has passed (the observed grant's expiry, on this process's
// clock), or earlier at will (a spurious wake only costs one acquire and
// one inspect); it returns ctx's error when ctx ends. A Waiter that
// listens for notifications must fall back to polling when it cannot
// listen; when Wait fails, the elector polls. LeaseWaiter adapts
// lease.Waiter (LISTEN pg_lease).
type Waiter interface {
	Wait(ctx context.Context, key string, until time.Time) error
}

// Config configures an Elector. Zero fields take the defaults stated on
// each; New validates the whole Config once.
type Config struct {
	// Key is the lease key that candidates compete for. Required.
	Key string

	// Identity is this candidate's owner name in the lease. It must be
	// unique per process incarnation: two live processes with the same
	// identity share a grant (lease.acquire is idempotent for its holder).
	// Default: "<hostname>-<pid>-<8 random hex digits>".
	Identity string

	// TTL is the lease duration requested on every acquire and renewal.
	// Default DefaultTTL (15s).
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
	// (Grant.ValidUntil) the leader context is cancelled. It must cover the
	// clock-rate drift over one grant (at least TTL*MaxClockRateDrift) and
	// the scheduling delay of the code that observes the cancellation; at
	// most TTL/3. Default min(TTL/3, SchedulingMargin + TTL/1000).
	Margin time.Duration

	// HealthTolerance is how long past the local deadline Check tolerates a
	// term whose OnStartedLeading has not yet returned. Default
	// RenewInterval.
	HealthTolerance time.Duration

	// Waiter wakes followers when the key is released or the observed grant
	// expires. Nil: poll every RetryInterval (and at the observed expiry).
	Waiter Waiter

	Callbacks Callbacks

	// Logger receives state changes (Info) and failed calls (Error).
	// Default: discard.
	Logger logr.Logger

	// Metrics to update; several electors may share one (their series are
	// labelled by key). Nil: metrics are kept but not registered anywhere.
	Metrics *Metrics
}

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
}

// withDefaults returns c with every zero field set to its default, and
// validates the result.
func (c Config) withDefaults() (Config, error) {
	if c.Key == "" {
		return c, configErr("Key", "must not be empty")
	}
	if len(c.Key) > 1024 {
		return c, configErr("Key", "must be at most 1024 bytes, got %d", len(c.Key))
	}
	if c.Identity == "" {
		c.Identity = defaultIdentity()
	}
	if len(c.Identity) > 1024 {
		return c, configErr("Identity", "must be at most 1024 bytes, got %d", len(c.Identity))
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTL < 3*time.Millisecond {
		return c, configErr("TTL", "must be at least 3ms, got %v", c.TTL)
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.RenewInterval < 0 || c.RenewInterval > c.TTL/3 {
		return c, configErr("RenewInterval", "must be positive and at most TTL/3 (%v), got %v", c.TTL/3, c.RenewInterval)
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = c.RenewInterval / 2
	}
	if c.RetryInterval < 0 || c.RetryInterval > c.RenewInterval {
		return c, configErr("RetryInterval", "must be positive and at most RenewInterval (%v), got %v", c.RenewInterval, c.RetryInterval)
	}
	minMargin := minMargin(c.TTL)
	if c.Margin == 0 {
		c.Margin = min(c.TTL/3, SchedulingMargin+minMargin)
	}
	if c.Margin < minMargin || c.Margin > c.TTL/3 {
		return c, configErr("Margin", "must be at least TTL*MaxClockRateDrift (%v, clock-rate drift over one grant) and at most TTL/3 (%v), got %v",
			minMargin, c.TTL/3, c.Margin)
	}
	if c.HealthTolerance == 0 {
		c.HealthTolerance = c.RenewInterval
	}
	if c.HealthTolerance < 0 {
		return c, configErr("HealthTolerance", "must not be negative, got %v", c.HealthTolerance)
	}
	if c.Callbacks.OnStartedLeading == nil {
		return c, configErr("Callbacks.OnStartedLeading", "is required")
	}
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
	if c.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return c, err
		}
		c.Metrics = m
	}
	return c, nil
}

// minMargin is the clock-rate drift over one grant, rounded up to a
// microsecond.
func minMargin(ttl time.Duration) time.Duration {
	d := time.Duration(float64(ttl) * MaxClockRateDrift)
	return (d + time.Microsecond - 1).Truncate(time.Microsecond)
}

func defaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
