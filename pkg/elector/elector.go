package elector

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/pglease/pg_lease/pkg/internal/candidacy"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"k8s.io/utils/clock"
)

// Errors of the elector itself. A leader context's cause (context.Cause)
// is one of the lease package's term causes: lease.ErrLocalDeadline (no
// renewal before the local deadline), an error matching lease.ErrLost (the
// server answered a renewal with lapsed, not_owner or epoch_mismatch), or
// lease.ErrReleased (Run's context ended, the cause then also matching that
// context's cause, or OnStartedLeading returned).
// errAlreadyRunning: Run was called while another Run of the same Elector
// was running (a programming error: nothing to branch on).
var errAlreadyRunning = errors.New("elector: Run is already running")

// Elector campaigns for one lease key and runs Callbacks.OnStartedLeading
// for each term it wins. See the package documentation.
type Elector struct {
	client  *lease.Client
	cfg     Config
	reg     *candidacy.Registrar       // nil without a Candidacy; Run's goroutine only
	clock   clock.WithDelayedExecution // the client's
	metrics *metrics

	running atomic.Bool

	// lastEpoch is the epoch of the last term this elector started; a term
	// is never started again under it or a lower one. Run's goroutine only.
	lastEpoch int64

	// takenLogged is when the elector last logged that its identity is
	// held by another session, and takenQuiet how many such findings it
	// has not logged since. Run's goroutine only.
	takenLogged time.Time
	takenQuiet  int

	mu       sync.Mutex
	term     *lease.Term     // the current term, from its start until OnStoppedLeading returned
	lctx     context.Context // its leader context
	lastTerm lease.Grant
	leader   string
	epoch    int64
	// notMine is the epoch of a grant held under this elector's identity
	// that the server refused to it: another database role's grant (owner
	// strings are not authenticated), or another process's. The elector
	// follows it as another holder's.
	notMine int64
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
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	e := &Elector{client: client, cfg: c, clock: client.Clock(), metrics: m}
	if c.Candidacy != nil {
		e.reg = candidacy.New(client, c.Key, c.Identity, c.TTL, *c.Candidacy)
	}
	return e, nil
}

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
	// IdentityTaken is true while the observed holder carries this
	// elector's identity under a grant the server refused to it: another
	// database role (or another process) holds the key under the same
	// owner string. The elector follows it as another holder's.
	IdentityTaken bool
}

// Status returns the elector's current view.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Status{Grant: e.lastTerm, Leader: e.leader, Epoch: e.epoch}
	s.IdentityTaken = e.term == nil && e.leader == e.cfg.Identity && e.epoch != 0 && e.epoch == e.notMine
	if t := e.term; t != nil {
		s.Leading = e.lctx.Err() == nil
		s.Grant = t.Grant()
		s.Deadline = t.Deadline()
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
	if late := e.clock.Since(t.Deadline()); late > e.cfg.HealthTolerance {
		return fmt.Errorf("elector: unhealthy: term %s is still running %v past its local deadline (tolerance %v)",
			t.Grant().Token, late.Round(time.Millisecond), e.cfg.HealthTolerance)
	}
	return nil
}

// Run campaigns for the key until ctx ends, leading whenever it wins. When
// ctx ends during a term, the leader context is cancelled, renewals go on
// until OnStartedLeading has returned, and then the lease is released so
// that another candidate takes over without waiting for the TTL. Run
// returns nil after ctx ended, or an error that retrying cannot fix
// (pg_lease not installed, invalid input, a second Run of the same
// Elector while one runs).
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer e.running.Store(false)
	log := e.cfg.Logger.WithValues("key", e.cfg.Key, "identity", e.cfg.Identity)
	log.V(1).Info("campaigning")
	if e.reg != nil {
		defer func() {
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.TTL)
			defer cancel()
			if err := e.reg.Withdraw(wctx); err != nil {
				log.Error(err, "withdrawing the candidate registration failed; it lapses at its TTL")
			}
		}()
	}
	for {
		g, err := e.campaign(ctx)
		if ctx.Err() != nil {
			// A grant obtained as ctx ended (or one the server committed
			// after the connection gave up on the call) must not wait for
			// its TTL: give it back.
			e.releaseAfterCancel(ctx, g)
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
			e.sleep(ctx, e.cfg.RetryInterval)
		}
	}
}

// fatal reports errors that retrying cannot fix.
func fatal(err error) bool {
	return errors.Is(err, lease.ErrNotInstalled) || errors.Is(err, lease.ErrInvalidInput) ||
		errors.Is(err, lease.ErrPermission)
}

// campaign tries to acquire the key until it gets a grant it may start a
// term under, or ctx ends. When ctx ends it returns the grant it got in
// that instant, if any.
func (e *Elector) campaign(ctx context.Context) (lease.Grant, error) {
	c := &e.cfg
	log := c.Logger.WithValues("key", c.Key, "identity", c.Identity)
	// self is the epoch of the grant under this elector's identity that
	// follow last returned on (0: none): the next acquire's refusal proves
	// that grant is not this elector's.
	var self int64
	for {
		if err := ctx.Err(); err != nil {
			return lease.Grant{}, err
		}
		actx, cancel := context.WithTimeout(ctx, c.TTL)
		g, ok, err := e.client.Acquire(actx, c.Key, c.Identity, c.TTL)
		cancel()
		switch {
		case errors.Is(err, lease.ErrGrace):
			// A promotion's grace: no grant before it ends, and nothing is
			// written when it ends. Sleep until then (one acquire per grace).
			log.Info("no new grant during the promotion grace; waiting for its end", "err", err)
			listen.WaitOutGrace(ctx, e.client, err)
			continue
		case err != nil:
			if ctx.Err() != nil {
				return lease.Grant{}, ctx.Err()
			}
			e.countError(errorKindAcquire)
			if fatal(err) {
				log.Error(err, "acquire failed; giving up")
				return lease.Grant{}, err
			}
			log.Error(err, "acquire failed; retrying", "retryInterval", c.RetryInterval)
			e.sleep(ctx, c.RetryInterval)
			continue
		case ok && ctx.Err() != nil:
			return g, ctx.Err()
		case ok && g.Epoch <= e.lastEpoch:
			// Our previous grant is still current on the server (its term
			// ended on the local deadline, within Margin of the server's
			// expiry). Never start a term twice under one epoch: release
			// it, so that the next grant carries a new epoch.
			log.Info("previous grant still current on the server; releasing it", "epoch", g.Epoch)
			if err := e.release(ctx, g.Token); err != nil && !errors.Is(err, lease.ErrLost) {
				e.sleep(ctx, c.RetryInterval)
			}
			continue
		case ok:
			if g.ValidUntil().Sub(e.clock.Now()) <= c.Margin+c.RetryInterval {
				// The answer took most of the TTL to arrive: renew before
				// starting a term that would end at once.
				rctx, cancel := context.WithTimeout(ctx, max(g.ValidUntil().Sub(e.clock.Now())-c.Margin, 0))
				rg, err := e.client.Renew(rctx, g.Token, c.TTL)
				cancel()
				if err != nil || rg.ValidUntil().Sub(e.clock.Now()) <= c.Margin {
					// Ask again at once: the next acquire returns this
					// grant, or a new one if it lapsed. One that fails
					// pauses RetryInterval as any failed acquire does.
					log.Info("grant arrived too late to lead under; asking again", "epoch", g.Epoch, "err", err)
					continue
				}
				g = rg
			}
			return g, nil
		}

		// Refused. When follow had just read the key held under this
		// elector's identity, that grant is another session's: the server
		// gives a holder's own grant back to it. Follow it as another
		// holder's instead of asking again at once.
		if self != 0 {
			e.identityTaken(log, self)
		}

		// Held by another owner: wait (lease's one wake policy) until it is
		// free, or handed to this elector.
		var st lease.State
		st, err = e.follow(ctx)
		self = 0
		if err == nil && st.Held && st.Owner == c.Identity {
			self = st.Epoch
		}
		if err != nil {
			if ctx.Err() != nil {
				return lease.Grant{}, ctx.Err()
			}
			e.countError(errorKindInspect)
			log.Error(err, "inspect failed; retrying", "retryInterval", c.RetryInterval)
			e.sleep(ctx, c.RetryInterval)
		}
	}
}

// inFlightPause is how long a follower waits before asking again when an
// acquire was refused while the key reads free: the cadence at which the
// server's own blocking acquire polls.
const inFlightPause = 50 * time.Millisecond

// identityTaken records that the grant of epoch under this elector's
// identity is not its own, counts it, and logs it at most once a minute.
func (e *Elector) identityTaken(log logr.Logger, epoch int64) {
	e.mu.Lock()
	e.notMine = epoch
	e.mu.Unlock()
	e.countError(errorKindIdentityTaken)
	now := e.clock.Now()
	if !e.takenLogged.IsZero() && now.Sub(e.takenLogged) < identityLogEvery {
		e.takenQuiet++
		return
	}
	log.Info("the key is held under this elector's identity by another session (another database role, "+
		"or a process sharing the identity); following it as another holder", "epoch", epoch,
		"notLoggedSince", e.takenQuiet)
	e.takenLogged, e.takenQuiet = now, 0
}

// identityLogEvery is how often at most the elector logs that its identity
// is held by another session.
const identityLogEvery = time.Minute

// follow waits, after an acquire was refused, until the key is free or
// held by this elector (a leader's release handed it over), and returns
// the state it ended on. A grant under this elector's identity whose epoch
// the server already refused to it (notMine) is another holder's. A key that
// reads free right after the refusal has a change in flight. Another
// transaction holds its row: a grant or renewal whose commit waits for the
// synchronous standbys, say. follow then pauses min(RetryInterval,
// inFlightPause) before it returns. Returning at once spins on acquire and
// inspect until that transaction ends: a thousand calls a second after a
// promotion in strict synchronous mode. With a Candidacy it keeps the
// registration fresh: each wait lasts at most the registration's Interval,
// and ends at once when the candidate becomes ready.
func (e *Elector) follow(ctx context.Context) (lease.State, error) {
	c := &e.cfg
	e.mu.Lock()
	notMine := e.notMine
	e.mu.Unlock()
	first, inFlight := true, false // the first read since the refusal; it found the key free
	for {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if e.reg != nil {
			if err := e.reg.Refresh(ctx); err != nil {
				if ctx.Err() != nil {
					return lease.State{}, ctx.Err()
				}
				e.countError(errorKindRegister)
				c.Logger.Error(err, "candidate registration failed; retrying", "key", c.Key, "identity", c.Identity)
			}
			wctx, cancel = e.reg.WatchReady(ctx)
			var tcancel context.CancelFunc
			wctx, tcancel = context.WithTimeout(wctx, e.reg.Interval())
			prev := cancel
			cancel = func() { tcancel(); prev() }
		}
		st, err := listen.Await(wctx, c.Waiter, e.client, c.Key, c.RetryInterval, func(st lease.State) bool {
			if st.Held {
				e.observe(st.Owner, st.Epoch)
			}
			inFlight = inFlight || first && !st.Held
			first = false
			return !st.Held || st.Owner == c.Identity && st.Epoch != notMine
		})
		cancel()
		if err == nil && inFlight {
			e.sleep(ctx, min(c.RetryInterval, inFlightPause))
		}
		if err != nil && ctx.Err() == nil && wctx.Err() != nil {
			continue // time to renew the registration
		}
		return st, err
	}
}

// releaseAfterCancel gives back a grant obtained as Run's context ended:
// g when the acquire's answer arrived, or else whatever the server holds
// for this identity (an acquire the server committed after the connection
// gave up on it on cancellation). The identity is unique per process
// incarnation, so a grant held under it is this elector's.
func (e *Elector) releaseAfterCancel(ctx context.Context, g lease.Grant) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.TTL)
	defer cancel()
	tok := g.Token
	if tok.Epoch == 0 {
		st, err := e.client.Inspect(rctx, e.cfg.Key)
		e.mu.Lock()
		notMine := e.notMine
		e.mu.Unlock()
		if err != nil || !st.Held || st.Owner != e.cfg.Identity || st.Epoch == notMine {
			return
		}
		tok = lease.Token{Key: e.cfg.Key, Owner: st.Owner, Epoch: st.Epoch}
	}
	if err := e.release(rctx, tok); err != nil {
		e.cfg.Logger.Error(err, "release after Run's context ended failed; the lease lapses at its expiry",
			"key", e.cfg.Key, "epoch", tok.Epoch)
	}
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

	t, err := e.client.Begin(g, c.Margin, nil)
	if err != nil { // cannot happen: New checked the margin
		log.Error(err, "cannot start a term")
		return false
	}
	// The leader context keeps ctx's values but not its cancellation: it
	// ends with the term (its local deadline, a loss the server reports) or
	// when the elector resigns (Run's context ended, OnStartedLeading
	// returned), while the term itself is kept alive until
	// OnStartedLeading has returned.
	rctx, resign := context.WithCancelCause(context.WithoutCancel(ctx))
	defer resign(nil)
	lctx, cancel := t.Context(rctx)
	defer cancel()
	stopAfter := context.AfterFunc(ctx, func() { resign(fmt.Errorf("%w: %w", lease.ErrReleased, context.Cause(ctx))) })
	defer stopAfter()

	e.mu.Lock()
	e.term, e.lctx = t, lctx
	e.mu.Unlock()
	e.observe(c.Identity, g.Epoch)
	e.metrics.leader.WithLabelValues(key).Set(1)
	e.metrics.epoch.WithLabelValues(key).Set(float64(g.Epoch))
	e.metrics.transitions.WithLabelValues(key, "started").Inc()
	log.Info("started leading", "validFor", t.Deadline().Sub(e.clock.Now()).Round(time.Millisecond))

	// Renewals go on until OnStartedLeading returns, even once resigning,
	// and stop when the term ends (its deadline, or a loss).
	kctx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRenewing()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer stopRenewing()
		c.Callbacks.OnStartedLeading(lctx)
	}()
	_ = t.KeepAlive(kctx, lease.KeepAliveOptions{
		Interval: c.RenewInterval, RetryInterval: c.RetryInterval,
		Observe: func(t *lease.Term, took time.Duration, err error) { e.renewed(log, t, took, err) },
	})
	if t.Err() == nil {
		// OnStartedLeading returned: resign if still leading.
		resigned = lctx.Err() == nil
		resign(lease.ErrReleased)
	}

	cause := context.Cause(lctx)
	if errors.Is(t.Err(), lease.ErrLocalDeadline) {
		e.countError(errorKindDeadline)
	}
	log.Info("stopped leading; waiting for OnStartedLeading to return", "cause", cause.Error())
	<-done
	if t.Err() == nil {
		// Resigned with the term live: end it and hand the key on now.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.Deadline().Sub(e.clock.Now()))
		if err := t.Release(rctx); err != nil {
			e.countError(errorKindRelease)
			log.Error(err, "release failed; the lease lapses at its expiry")
		} else {
			log.Info("released")
		}
		cancel()
	}
	if f := c.Callbacks.OnStoppedLeading; f != nil {
		f()
	}
	e.metrics.leader.WithLabelValues(key).Set(0)
	e.metrics.epoch.WithLabelValues(key).Set(0)
	e.metrics.transitions.WithLabelValues(key, "stopped").Inc()
	e.mu.Lock()
	e.lastTerm = t.Grant()
	e.term, e.lctx = nil, nil
	e.mu.Unlock()
	return resigned
}

// renewed records one renewal of the term t: its latency, and a failure.
func (e *Elector) renewed(log logr.Logger, t *lease.Term, took time.Duration, err error) {
	e.metrics.renew.WithLabelValues(e.cfg.Key).Observe(took.Seconds())
	switch {
	case err == nil, errors.Is(err, lease.ErrLocalDeadline):
		// A renewal answered after the deadline ended the term: counted
		// as a deadline when the term is over.
	case errors.Is(err, lease.ErrLost):
		e.countError(lostKind(err))
	default:
		e.countError(errorKindRenew)
		left := t.Deadline().Sub(e.clock.Now())
		log.Error(err, "renew failed; retrying", "retryInterval", e.cfg.RetryInterval,
			"untilDeadline", left.Round(time.Millisecond))
	}
}

// release releases t; it may run after Run's context ended, so it does not
// inherit its cancellation, and is bounded by the TTL.
func (e *Elector) release(ctx context.Context, t lease.Token) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.TTL)
	defer cancel()
	err := e.client.Release(rctx, t)
	if err != nil {
		e.countError(errorKindRelease)
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
	e.metrics.errors.WithLabelValues(e.cfg.Key, kind).Inc()
}

func lostKind(err error) string {
	switch {
	case errors.Is(err, lease.ErrLapsed):
		return errorKindLapsed
	case errors.Is(err, lease.ErrEpochMismatch):
		return errorKindEpochMismatch
	default:
		return errorKindNotOwner
	}
}

// sleep waits for d on the client's clock, or until ctx ends.
func (e *Elector) sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := e.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}
