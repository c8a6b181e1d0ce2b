package elector

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Causes of a leader context's cancellation, read with context.Cause.
var (
	// ErrRenewDeadline: renewals did not succeed before the grant's local
	// deadline (Grant.ValidUntil minus Margin). The server may still hold
	// the grant for up to Margin; nobody else can have it yet.
	ErrRenewDeadline = errors.New("elector: no successful renewal before the local deadline")
	// ErrLeadershipLost: the server answered a renewal with lapsed,
	// not_owner or epoch_mismatch; the cause also matches lease.ErrLost and
	// the specific lease sentinel.
	ErrLeadershipLost = errors.New("elector: leadership lost")
	// ErrResigned: Run's context ended (the cause also matches that
	// context's cause) or OnStartedLeading returned; the lease is released
	// once OnStartedLeading has returned.
	ErrResigned = errors.New("elector: resigned")

	// ErrAlreadyRunning: Run was called while another Run of the same
	// Elector was running.
	ErrAlreadyRunning = errors.New("elector: Run is already running")
	// ErrUnhealthy is returned by Check.
	ErrUnhealthy = errors.New("elector: unhealthy")
)

// Elector campaigns for one lease key and runs Callbacks.OnStartedLeading
// for each term it wins. See the package documentation.
type Elector struct {
	client *lease.Client
	cfg    Config

	running atomic.Bool

	// lastEpoch is the epoch of the last term this elector started; a term
	// is never started again under it or a lower one. Run's goroutine only.
	lastEpoch int64

	mu       sync.Mutex
	term     *term // the current term, from its start until OnStoppedLeading returned
	lastTerm lease.Grant
	leader   string
	epoch    int64
}

type term struct {
	ctx      context.Context // the leader context
	grant    lease.Grant     // the latest grant (acquire or renewal)
	deadline time.Time       // grant.ValidUntil() - Margin
	started  time.Time
}

// New validates cfg (naming the field in each error, which matches
// ErrInvalidConfig), fills its defaults and returns an Elector that uses
// client for every lease call.
func New(client *lease.Client, cfg Config) (*Elector, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client: must not be nil", ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Elector{client: client, cfg: c}, nil
}

// Config returns the configuration in effect, defaults filled in.
func (e *Elector) Config() Config { return e.cfg }

// Identity is the owner name this elector campaigns under.
func (e *Elector) Identity() string { return e.cfg.Identity }

// Status is a snapshot of an elector's view.
type Status struct {
	// Leading is true from the start of a term until its leader context is
	// cancelled.
	Leading bool
	// Grant is the latest grant of the current term, or of the last term
	// once it ended (zero before the first term).
	Grant lease.Grant
	// Deadline is the local instant at which the current term's leader
	// context is cancelled unless a renewal succeeds first (zero when no
	// term is in progress).
	Deadline time.Time
	// Leader and Epoch are the last observed holder of the key (this
	// elector included).
	Leader string
	Epoch  int64
}

// Status returns the elector's current view.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Status{Grant: e.lastTerm, Leader: e.leader, Epoch: e.epoch}
	if t := e.term; t != nil {
		s.Leading = t.ctx.Err() == nil
		s.Grant = t.grant
		s.Deadline = t.deadline
	}
	return s
}

// Check is a health check in the shape of controller-runtime's
// healthz.Checker and client-go's HealthzAdaptor: it fails while a term is
// in progress (OnStartedLeading has not returned) more than HealthTolerance
// past the term's local deadline, that is while this process may still
// act as leader although its grant can have expired on the server. Only a
// callback that ignores its cancelled context, or an elector goroutine that
// is stuck, makes it fail.
func (e *Elector) Check(_ *http.Request) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.term
	if t == nil {
		return nil
	}
	if late := time.Since(t.deadline); late > e.cfg.HealthTolerance {
		return fmt.Errorf("%w: term %s is still running %v past its local deadline (tolerance %v)",
			ErrUnhealthy, t.grant.Token, late.Round(time.Millisecond), e.cfg.HealthTolerance)
	}
	return nil
}

// Run campaigns for the key until ctx ends, leading whenever it wins. When
// ctx ends during a term, the leader context is cancelled, renewals go on
// until OnStartedLeading has returned, and then the lease is released so
// that another candidate takes over without waiting for the TTL. Run
// returns nil after ctx ended, or an error that retrying cannot fix
// (pg_lease not installed, invalid input, ErrAlreadyRunning).
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer e.running.Store(false)
	log := e.cfg.Logger.WithValues("key", e.cfg.Key, "identity", e.cfg.Identity)
	log.V(1).Info("campaigning")
	for {
		g, err := e.campaign(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		resigned := e.lead(ctx, g)
		if ctx.Err() != nil {
			return nil
		}
		if resigned {
			// Give the other candidates, woken by the release, the first
			// chance.
			sleep(ctx, e.cfg.RetryInterval)
		}
	}
}

// fatal reports errors that retrying cannot fix.
func fatal(err error) bool {
	return errors.Is(err, lease.ErrNotInstalled) || errors.Is(err, lease.ErrInvalidInput) ||
		errors.Is(err, lease.ErrVersionMismatch)
}

// campaign tries to acquire the key until it gets a grant it may start a
// term under, or ctx ends.
func (e *Elector) campaign(ctx context.Context) (lease.Grant, error) {
	c := &e.cfg
	log := c.Logger.WithValues("key", c.Key, "identity", c.Identity)
	for {
		if err := ctx.Err(); err != nil {
			return lease.Grant{}, err
		}
		actx, cancel := context.WithTimeout(ctx, c.TTL)
		g, ok, err := e.client.Acquire(actx, c.Key, c.Identity, c.TTL)
		cancel()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return lease.Grant{}, ctx.Err()
			}
			e.countError(ErrorKindAcquire)
			if fatal(err) {
				log.Error(err, "acquire failed; giving up")
				return lease.Grant{}, err
			}
			log.Error(err, "acquire failed; retrying", "retryInterval", c.RetryInterval)
			sleep(ctx, c.RetryInterval)
			continue
		case ok && g.Epoch <= e.lastEpoch:
			// Our previous grant is still current on the server (its term
			// ended on the local deadline, within Margin of the server's
			// expiry). Never start a term twice under one epoch: release
			// it, so that the next grant carries a new epoch.
			log.Info("previous grant still current on the server; releasing it", "epoch", g.Epoch)
			if err := e.release(ctx, g.Token, time.Now().Add(c.TTL)); err != nil && !errors.Is(err, lease.ErrLost) {
				sleep(ctx, c.RetryInterval)
			}
			continue
		case ok:
			if time.Until(g.ValidUntil()) <= c.Margin+c.RetryInterval {
				// The answer took most of the TTL to arrive: renew before
				// starting a term that would end at once.
				rg, err := e.renewCall(ctx, g.Token, g.ValidUntil().Add(-c.Margin))
				if err != nil || time.Until(rg.ValidUntil()) <= c.Margin {
					log.Info("grant arrived too late to lead under; retrying", "epoch", g.Epoch, "err", err)
					sleep(ctx, c.RetryInterval)
					continue
				}
				g = rg
			}
			return g, nil
		}

		// Held by another owner: see who, and wait for a release or for
		// that grant's expiry.
		ictx, cancel := context.WithTimeout(ctx, c.TTL)
		st, err := e.client.Inspect(ictx, c.Key)
		received := time.Now()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return lease.Grant{}, ctx.Err()
			}
			e.countError(ErrorKindInspect)
			log.Error(err, "inspect failed; retrying", "retryInterval", c.RetryInterval)
			sleep(ctx, c.RetryInterval)
			continue
		}
		if !st.Held {
			continue // released or lapsed in between: try again at once
		}
		e.observe(st.Owner, st.Epoch)
		// The grant expires at most this late on our clock (the answer
		// cannot be older than its receipt). Waking late only delays the
		// takeover by the round trip; waking early costs a retry.
		e.wait(ctx, received.Add(st.ExpiresAt.Sub(st.ServerNow)))
	}
}

// wait blocks until the key may be free: the Waiter's wake, or, without a
// Waiter (or when it fails), until the earlier of until and RetryInterval.
func (e *Elector) wait(ctx context.Context, until time.Time) {
	if w := e.cfg.Waiter; w != nil {
		err := w.Wait(ctx, e.cfg.Key, until)
		if err == nil || ctx.Err() != nil {
			return
		}
		e.countError(ErrorKindWait)
		e.cfg.Logger.Error(err, "waiter failed; polling", "key", e.cfg.Key)
	}
	sleep(ctx, min(time.Until(until), e.cfg.RetryInterval))
}

// lead runs one term under grant g. It returns after the leader context was
// cancelled, OnStartedLeading returned, the lease was released (when the
// term ended by resignation), and OnStoppedLeading returned. resigned
// reports that the term ended because OnStartedLeading returned on its own.
func (e *Elector) lead(ctx context.Context, g lease.Grant) (resigned bool) {
	c := &e.cfg
	key := c.Key
	log := c.Logger.WithValues("key", key, "identity", c.Identity, "epoch", g.Epoch)
	e.lastEpoch = g.Epoch

	// The leader context keeps ctx's values but not its cancellation: the
	// elector cancels it itself, with a cause, from one of four places.
	lctx, cancel := context.WithCancelCause(lease.ContextWithToken(context.WithoutCancel(ctx), g.Token))
	defer cancel(nil)
	t := &term{ctx: lctx, grant: g, deadline: g.ValidUntil().Add(-c.Margin), started: time.Now()}
	// 1. The local deadline.
	deadlineTimer := time.AfterFunc(time.Until(t.deadline), func() { cancel(ErrRenewDeadline) })
	defer deadlineTimer.Stop()
	// 2. Run's context.
	stopAfter := context.AfterFunc(ctx, func() { cancel(fmt.Errorf("%w: %w", ErrResigned, context.Cause(ctx))) })
	defer stopAfter()

	e.mu.Lock()
	e.term = t
	e.mu.Unlock()
	e.observe(c.Identity, g.Epoch)
	c.Metrics.leader.WithLabelValues(key).Set(1)
	c.Metrics.epoch.WithLabelValues(key).Set(float64(g.Epoch))
	c.Metrics.transitions.WithLabelValues(key, "started").Inc()
	log.Info("started leading", "validFor", time.Until(t.deadline).Round(time.Millisecond))

	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Callbacks.OnStartedLeading(lctx)
	}()

	renewTimer := time.NewTimer(c.RenewInterval)
	defer renewTimer.Stop()
	renewC := renewTimer.C
	lctxDone := lctx.Done()
	deadline := t.deadline
	lost := false
loop:
	for {
		select {
		case <-done:
			// 3. OnStartedLeading returned: resign if still leading.
			if lctx.Err() == nil {
				resigned = true
			}
			cancel(ErrResigned)
			break loop
		case <-lctxDone:
			lctxDone = nil
			if !errors.Is(context.Cause(lctx), ErrResigned) {
				break loop // deadline: stop renewing
			}
			// Resigning: keep the grant alive until OnStartedLeading
			// returns, then release it.
		case <-renewC:
			if time.Now().After(deadline) {
				renewC = nil
				continue
			}
			ng, err := e.renewCall(ctx, g.Token, deadline)
			switch {
			case err == nil:
				nd := ng.ValidUntil().Add(-c.Margin)
				// Extend only a term that has not ended on its deadline:
				// once the timer has fired, the term is over whatever a
				// late renewal says.
				if deadlineTimer.Stop() {
					deadlineTimer.Reset(time.Until(nd))
					deadline, g = nd, ng
					e.mu.Lock()
					t.grant, t.deadline = ng, nd
					e.mu.Unlock()
				}
				renewTimer.Reset(c.RenewInterval)
			case errors.Is(err, lease.ErrLost):
				// 4. The server says the grant is gone.
				e.countError(lostKind(err))
				lost = true
				cancel(fmt.Errorf("%w: %w", ErrLeadershipLost, err))
				break loop
			default:
				e.countError(ErrorKindRenew)
				log.Error(err, "renew failed; retrying", "retryInterval", c.RetryInterval,
					"untilDeadline", time.Until(deadline).Round(time.Millisecond))
				renewTimer.Reset(min(c.RetryInterval, max(time.Until(deadline), 0)))
			}
		}
	}

	cause := context.Cause(lctx)
	if errors.Is(cause, ErrRenewDeadline) {
		e.countError(ErrorKindDeadline)
	}
	log.Info("stopped leading; waiting for OnStartedLeading to return", "cause", cause.Error())
	<-done
	if errors.Is(cause, ErrResigned) && !lost && time.Now().Before(deadline) {
		if err := e.release(ctx, g.Token, deadline); err != nil {
			log.Error(err, "release failed; the lease lapses at its expiry")
		} else {
			log.Info("released")
		}
	}
	if f := c.Callbacks.OnStoppedLeading; f != nil {
		f()
	}
	c.Metrics.leader.WithLabelValues(key).Set(0)
	c.Metrics.epoch.WithLabelValues(key).Set(0)
	c.Metrics.transitions.WithLabelValues(key, "stopped").Inc()
	e.mu.Lock()
	e.lastTerm = t.grant
	e.term = nil
	e.mu.Unlock()
	return resigned
}

// renewCall renews t, bounded by the local deadline: an answer after it is
// of no use.
func (e *Elector) renewCall(ctx context.Context, t lease.Token, deadline time.Time) (lease.Grant, error) {
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	start := time.Now()
	g, err := e.client.Renew(rctx, t, e.cfg.TTL)
	e.cfg.Metrics.renew.WithLabelValues(e.cfg.Key).Observe(time.Since(start).Seconds())
	return g, err
}

// release releases t, bounded by deadline; it runs after Run's context
// ended, so it does not inherit its cancellation.
func (e *Elector) release(ctx context.Context, t lease.Token, deadline time.Time) error {
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	err := e.client.Release(rctx, t)
	if err != nil {
		e.countError(ErrorKindRelease)
	}
	return err
}

// observe records the observed holder and calls OnNewLeader when it
// changed.
func (e *Elector) observe(identity string, epoch int64) {
	e.mu.Lock()
	changed := e.leader != identity || e.epoch != epoch
	e.leader, e.epoch = identity, epoch
	e.mu.Unlock()
	if changed && e.cfg.Callbacks.OnNewLeader != nil {
		e.cfg.Callbacks.OnNewLeader(identity, epoch)
	}
}

func (e *Elector) countError(kind string) {
	e.cfg.Metrics.errors.WithLabelValues(e.cfg.Key, kind).Inc()
}

func lostKind(err error) string {
	switch {
	case errors.Is(err, lease.ErrLapsed):
		return ErrorKindLapsed
	case errors.Is(err, lease.ErrEpochMismatch):
		return ErrorKindEpochMismatch
	default:
		return ErrorKindNotOwner
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
