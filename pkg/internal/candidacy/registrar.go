// Package candidacy keeps an elector's or a lock's follower registered as a
// candidate of its key, so that a leader's release can hand the key to it.
package candidacy

import (
	"context"
	"errors"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Registrar keeps one candidate of one key registered. It is not safe for
// concurrent use: its owner (an elector's campaign, a lock's Get) calls it.
type Registrar struct {
	c          *lease.Client
	key, owner string
	ttl        time.Duration
	cand       handover.Candidacy

	strategySet bool
	last        time.Time // local time of the last successful registration
	lastReady   bool
}

// New returns a Registrar that registers owner as a candidate of key for
// ttl (also the TTL of a grant handed to it) with cand's attributes.
func New(c *lease.Client, key, owner string, ttl time.Duration, cand handover.Candidacy) *Registrar {
	return &Registrar{c: c, key: key, owner: owner, ttl: ttl, cand: cand}
}

// Interval is how often the registration must be renewed: the renewal
// cadence of a grant of its TTL (lease.RenewInterval).
func (r *Registrar) Interval() time.Duration { return lease.RenewInterval(r.ttl) }

// Ready reports the candidate's readiness now.
func (r *Registrar) Ready() bool { return r.cand.Ready == nil || r.cand.Ready() }

// Due reports whether Refresh would register: never registered, an
// Interval since the last registration, or readiness changed since.
func (r *Registrar) Due() bool {
	return r.last.IsZero() || r.c.Clock().Since(r.last) >= r.Interval() || r.Ready() != r.lastReady
}

// RegisteredReady reports whether the last registration said ready.
func (r *Registrar) RegisteredReady() bool { return !r.last.IsZero() && r.lastReady }

// Refresh registers the candidate when Due (and sets the key's strategy at
// the first registration).
func (r *Registrar) Refresh(ctx context.Context) error {
	if !r.Due() {
		return nil
	}
	if !r.strategySet && r.cand.Strategy != "" {
		if _, err := handover.SetStrategy(ctx, r.c, r.key, r.cand.Strategy); err != nil && !errors.Is(err, lease.ErrPermission) {
			return err
		}
		// ErrPermission (pg_lease 0.4.0 only): another role set the key's
		// strategy; it stays.
		r.strategySet = true
	}
	ready := r.Ready()
	if _, err := handover.Register(ctx, r.c, r.key, handover.Candidate{
		Owner: r.owner, Version: r.cand.Version, Priority: r.cand.Priority, Ready: ready, TTL: r.ttl,
	}); err != nil {
		return err
	}
	r.last, r.lastReady = r.c.Clock().Now(), ready
	return nil
}

// Withdraw ends the registration (if any was made).
func (r *Registrar) Withdraw(ctx context.Context) error {
	if r.last.IsZero() {
		return nil
	}
	r.last = time.Time{}
	_, err := handover.Withdraw(ctx, r.c, r.key, r.owner)
	return err
}

// WatchReady returns a context that is done when ctx is, or, while the last
// registration said not ready, as soon as the candidate becomes ready (read
// every 100ms), so that a follower's wait ends and it registers as ready at
// once. Call cancel when done.
func (r *Registrar) WatchReady(ctx context.Context) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancel(ctx)
	if r.RegisteredReady() || r.cand.Ready == nil {
		return wctx, cancel
	}
	ready := r.cand.Ready
	clk := r.c.Clock()
	go func() {
		for {
			t := clk.NewTimer(100 * time.Millisecond)
			select {
			case <-wctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
			if ready() {
				cancel()
				return
			}
		}
	}()
	return wctx, cancel
}
