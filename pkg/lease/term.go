package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Term is one grant as this process holds it: one epoch, from the acquire
// that obtained it until it ends. Renewals extend a term and never change
// its epoch. A term ends exactly once, for one reason. Err gives it, and so
// does context.Cause of every context made by Context:
//
//   - ErrLocalDeadline: its local deadline passed without a renewal. The
//     deadline is Grant.ValidUntil minus the margin (CheckMargin). So the
//     server's expiry, and any successor's grant, come later (A1, see the
//     package documentation).
//   - ErrReleased: the holder gave it up (Release) before its deadline.
//   - an error matching ErrLost: the server said the grant is gone, on a
//     renewal answered before the deadline, or the holder learned it
//     otherwise (End).
//
// The cause does not depend on which goroutine notices the deadline first.
// The deadline timer may run late on a loaded machine; Renew and Release
// read the clock themselves. A term that Renew or Release ends at or after
// its deadline ends with ErrLocalDeadline. That covers a renewal whose
// answer comes after the deadline, or whose renewed grant is already past
// its own deadline, even when the answer is that the grant is gone. End
// reads no clock and ends the term with the cause it is given.
//
// Ending first cancels every context of the term, then calls the onEnd
// function given to Begin, then closes Done. Release and End return only
// after that. So whoever waits on Done, Release or End sees the end fully
// reported before it begins anything else: "term N ended" always comes
// before "term N+1 began". An ended term never comes back. A later grant,
// even to the same owner, is a new Term.
type Term struct {
	c      *Client
	margin time.Duration
	onEnd  func(Token, error)

	ctx    context.Context // carries the token; cancelled with the cause
	cancel context.CancelCauseFunc
	done   chan struct{} // closed after onEnd returned
	once   sync.Once

	renewMu sync.Mutex // one Renew at a time

	mu       sync.Mutex
	grant    Grant
	deadline time.Time
	gen      uint64      // which deadline timer may end the term
	timer    clock.Timer // the armed deadline timer
	ended    bool
	lost     error                                    // the server's word that the grant is gone, if it ended the term
	children map[*termContext]context.CancelCauseFunc // live contexts of Context
}

// Begin starts the term of g, a grant this client's Acquire (or Renew) just
// returned. The term ends margin before g.ValidUntil; margin 0 takes the
// default of CheckMargin(g.TTL, 0). onEnd, when not nil, is called once when
// the term ends, with the token and the cause. It runs after the term's
// contexts were cancelled and before Done is closed. It must not block for
// long, and may call no method of the term but Grant and Deadline.
//
// The answer may take most of the TTL to arrive, so that the deadline has
// already passed. Then the term has already ended with ErrLocalDeadline, but
// the grant is still held on the server: Release gives it back. Begin fails
// (ErrInvalidInput) only for a margin CheckMargin rejects.
func (c *Client) Begin(g Grant, margin time.Duration, onEnd func(Token, error)) (*Term, error) {
	m, err := CheckMargin(g.TTL, margin)
	if err != nil {
		return nil, fmt.Errorf("lease: term of %s: %w", g.Token, err)
	}
	ctx, cancel := context.WithCancelCause(ContextWithToken(context.Background(), g.Token))
	t := &Term{c: c, margin: m, onEnd: onEnd, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		grant: g, deadline: g.ValidUntil().Add(-m)}
	now := c.clock.Now()
	if !now.Before(t.deadline) {
		t.end(ErrLocalDeadline, nil)
		return t, nil
	}
	t.arm(t.deadline.Sub(now), 0)
	return t, nil
}

// arm starts the deadline timer of generation gen. Timers are armed and
// stopped outside t.mu: a fake clock runs their functions while holding its
// own lock.
func (t *Term) arm(d time.Duration, gen uint64) {
	timer := t.c.clock.AfterFunc(d, func() {
		t.mu.Lock()
		current := t.gen == gen
		t.mu.Unlock()
		if current {
			t.endBy(ErrLocalDeadline, nil, false)
		}
	})
	t.mu.Lock()
	old := t.timer
	t.timer = timer
	stale := t.gen != gen || t.ended
	t.mu.Unlock()
	if old != nil {
		old.Stop()
	}
	if stale {
		timer.Stop()
	}
}

// end ends the term once; every caller returns after the end was reported.
// lost is the server's word that the grant is gone, or nil.
func (t *Term) end(cause, lost error) { t.endBy(cause, lost, true) }

// endBy is end; stopTimer is false when the deadline timer itself calls it
// (a fake clock holds its lock while it runs timer functions).
func (t *Term) endBy(cause, lost error, stopTimer bool) {
	t.once.Do(func() {
		t.mu.Lock()
		t.ended, t.lost = true, lost
		t.gen++ // no timer may end it again
		timer := t.timer
		children := t.children
		t.children = nil
		t.mu.Unlock()
		if timer != nil && stopTimer {
			timer.Stop()
		}
		t.cancel(cause)
		for _, cancel := range children {
			cancel(cause)
		}
		if t.onEnd != nil {
			t.onEnd(t.grant.Token, cause)
		}
		close(t.done)
	})
	<-t.done
}

// Grant is the term's latest grant (its acquire, or its last renewal).
func (t *Term) Grant() Grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.grant
}

// Deadline is the local instant (on the client's clock) at which the term
// ends unless a renewal moves it: the latest grant's ValidUntil minus the
// margin.
func (t *Term) Deadline() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadline
}

// Done is closed once the term has ended and the end has been reported.
func (t *Term) Done() <-chan struct{} { return t.done }

// pastDeadline reports whether the term's deadline has passed on the
// client's clock. It reads the clock: never call it from the deadline timer.
func (t *Term) pastDeadline() bool {
	now := t.c.clock.Now()
	return !now.Before(t.Deadline())
}

// endLost ends the term on the server's answer err that its grant is gone:
// with err, or with ErrLocalDeadline if the deadline passed before the answer.
func (t *Term) endLost(err error) {
	cause := err
	if t.pastDeadline() {
		cause = ErrLocalDeadline
	}
	t.end(cause, err)
}

// Err is nil while the term lasts, then the cause it ended with. It turns
// non-nil when the term's contexts are cancelled, just before the end is
// reported; wait on Done to know that the report is over.
func (t *Term) Err() error {
	if t.ctx.Err() == nil {
		return nil
	}
	return context.Cause(t.ctx)
}

// Renew renews the grant for its TTL. When the term is still live and the
// answer arrives before its deadline, it moves the deadline and returns nil.
// When the server says the grant is gone, it ends the term and returns that
// error (matching ErrLost); the term's cause is that error, or
// ErrLocalDeadline if the answer came at or after the deadline. When the
// term had ended, or its deadline passed before the answer, or the renewed
// grant's own deadline had already passed when the answer came, the error
// matches ErrLocalDeadline and the term has ended (with ErrLocalDeadline,
// unless it had ended before); the grant may still be held, and Release
// gives it back. Any other error, such as a lost connection, leaves the
// term to its deadline. The call is bounded by the term's deadline: an
// answer after it is of no use.
func (t *Term) Renew(ctx context.Context) error {
	t.renewMu.Lock()
	defer t.renewMu.Unlock()
	if err := t.Err(); err != nil {
		return fmt.Errorf("lease: renew %s: term ended: %w", t.grant.Token, err)
	}
	rctx, cancel := context.WithTimeout(ctx, t.Deadline().Sub(t.c.clock.Now()))
	defer cancel()
	g, err := t.c.Renew(rctx, t.grant.Token, t.grant.TTL)
	switch {
	case errors.Is(err, ErrLost):
		t.endLost(err)
		return err
	case err != nil:
		if ctx.Err() == nil && rctx.Err() != nil {
			// The bound of the call, the term's deadline, passed.
			t.end(ErrLocalDeadline, nil)
			return fmt.Errorf("lease: renew %s: %w (%w)", t.grant.Token, ErrLocalDeadline, err)
		}
		return err
	}
	return t.extend(g)
}

// extend moves the term to the renewed grant g, unless the term ended or
// its deadline passed before the answer. The caller holds renewMu.
func (t *Term) extend(g Grant) error {
	now := t.c.clock.Now() // read outside t.mu (see arm)
	nd := g.ValidUntil().Add(-t.margin)
	t.mu.Lock()
	if t.ended || !now.Before(t.deadline) || !now.Before(nd) {
		// The term ended, or its deadline passed, before the answer, or
		// the renewed grant is already past its own deadline: what acted
		// under it has been (or is being) told to stop; do not resume it.
		// End it now rather than leave it to a timer that may run late.
		t.mu.Unlock()
		t.end(ErrLocalDeadline, nil)
		return fmt.Errorf("lease: renew %s: answer after the term's local deadline: %w", g.Token, ErrLocalDeadline)
	}
	t.grant, t.deadline = g, nd
	t.gen++
	gen := t.gen
	t.mu.Unlock()
	t.arm(nd.Sub(now), gen)
	return nil
}

// Release ends the term with ErrReleased, if it has not ended yet (with
// ErrLocalDeadline if its deadline has passed, whether or not the deadline
// timer has run yet). Then it
// releases the grant on the server: a successor need not wait for the TTL,
// and the next grant carries a greater epoch. It releases the grant of an
// ended term too, since one that ended on its deadline may still be held.
// It makes no call for a grant the server already said is gone, and returns
// the server's error (matching ErrLost). A release the server answers with
// not_owner, lapsed or epoch_mismatch returns such an error too.
func (t *Term) Release(ctx context.Context) error {
	cause := ErrReleased
	if t.pastDeadline() {
		cause = ErrLocalDeadline
	}
	t.end(cause, nil)
	t.mu.Lock()
	lost, g := t.lost, t.grant
	t.mu.Unlock()
	if lost != nil {
		return lost
	}
	return t.c.Release(ctx, g.Token)
}

// End ends the term with cause, without a call to the server: for a holder
// that learned otherwise that the grant is gone (cause should then match
// ErrLost; Release will not release it) or that must stop at once.
func (t *Term) End(cause error) {
	var lost error
	if errors.Is(cause, ErrLost) {
		lost = cause
	}
	t.end(cause, lost)
}

// Context returns a context with the values of parent that carries the
// term's token (TokenFromContext). It is done when the term ends, with the
// term's cause, or when parent is done, with parent's cause. Both reach it at
// once; the term's end reaches it before the end is reported. A context of a
// done parent, or of an ended term, is done when Context returns. Its
// Deadline is the earlier of parent's and the term's current one, which
// renewals move. Call cancel when done with it.
func (t *Term) Context(parent context.Context) (context.Context, context.CancelFunc) {
	t.mu.Lock()
	tok := t.grant.Token // a renewal (extend) writes t.grant under t.mu
	t.mu.Unlock()
	inner, cancel := context.WithCancelCause(ContextWithToken(parent, tok))
	ctx := &termContext{Context: inner, term: t}
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		cancel(context.Cause(t.ctx))
		return ctx, func() {}
	}
	if t.children == nil {
		t.children = map[*termContext]context.CancelCauseFunc{}
	}
	t.children[ctx] = cancel
	t.mu.Unlock()
	return ctx, func() {
		t.mu.Lock()
		delete(t.children, ctx)
		t.mu.Unlock()
		cancel(context.Canceled)
	}
}

// termContext is a context of the term with the term's deadline.
type termContext struct {
	context.Context
	term *Term
}

func (c *termContext) Deadline() (time.Time, bool) {
	d := c.term.Deadline()
	if pd, ok := c.Context.Deadline(); ok && pd.Before(d) {
		return pd, true
	}
	return d, true
}
