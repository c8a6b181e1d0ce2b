package resourcelock

// The lock's term: the grant it holds, its fencing token, and the
// report of every change of epoch.

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pg_lease/pkg/lease"
)

// liveTerm returns the live term, or nil when the lock holds none (never
// held, lost, released, or past its local deadline).
func (l *Lock) liveTerm() *lease.Term {
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	if t == nil || t.Err() != nil {
		return nil
	}
	return t
}

// Token returns the live term's fencing token; ok is false when the lock
// holds no live, unexpired term.
func (l *Lock) Token() (t lease.Token, ok bool) {
	if tm := l.liveTerm(); tm != nil && l.client.Clock().Now().Before(tm.Deadline()) {
		return tm.Grant().Token, true
	}
	return lease.Token{}, false
}

// TokenContext returns a context with the values of parent. It carries the
// live term's token (lease.TokenFromContext). It is done when the term ends,
// with the term's cause, or when parent is done (lease.Term.Context). The
// end of the term cancels it at once: before OnEpochChange hears of the end,
// and before any later term is handed out. It fails with ErrNotHolding when
// there is no live, unexpired term. Call cancel when done.
func (l *Lock) TokenContext(parent context.Context) (context.Context, context.CancelFunc, error) {
	t := l.liveTerm()
	if t == nil || !l.client.Clock().Now().Before(t.Deadline()) {
		return nil, nil, fmt.Errorf("%w: %s (identity %q)", ErrNotHolding, l.Describe(), l.cfg.Identity)
	}
	ctx, cancel := t.Context(parent)
	return ctx, cancel, nil
}

// begin starts the term of a new grant g and reports it. No term is held:
// callers drop or give back the old one first, which returns only after its
// end was reported. So the start is reported after every earlier end.
func (l *Lock) begin(ctx context.Context, g lease.Grant) error { return l.beginTerm(ctx, g, true) }

// beginTerm is begin; again allows one more acquire when g's answer came
// after its local deadline.
func (l *Lock) beginTerm(ctx context.Context, g lease.Grant, again bool) error {
	l.notify(lease.Token{}, g.Token)
	t, err := l.client.Begin(g, l.cfg.Margin, func(tok lease.Token, _ error) { l.notify(tok, lease.Token{}) })
	if err != nil {
		return err // cannot happen: New checked the margin
	}
	l.mu.Lock()
	l.term = t
	l.obs = l.heldRecord(g)
	l.mu.Unlock()
	if t.Err() == nil && t.Deadline().Sub(l.client.Clock().Now()) < l.cfg.LeaseDuration/2 {
		// The answer came late: the call waited most of the TTL (for a new
		// primary's first commit, say). Renew at once, so that the term
		// handed out lasts until client-go's next renewal, a RetryPeriod
		// away. A renewal answered after the deadline ends the term (given
		// back below); any other failure leaves it to its deadline.
		switch err := t.Renew(ctx); {
		case err == nil:
			l.mu.Lock()
			l.obs = l.heldRecord(t.Grant())
			l.mu.Unlock()
		case errors.Is(err, lease.ErrLost):
			l.drop(t)
			return l.conflict(err)
		}
	}
	if t.Err() == nil {
		return nil
	}
	// Granted, but the answer came back after the grant's local deadline:
	// never hand it out. Give it back, and ask once more at once: the
	// server that made the answer late (a new primary before its first
	// commit) answers the next call promptly, and waiting for client-go's
	// next RetryPeriod would leave the key leaderless that much longer.
	if err := l.giveBack(ctx, t); err != nil {
		return err
	}
	late := l.conflict(fmt.Errorf("%w: grant %s arrived too late to use", lease.ErrLocalDeadline, g.Token))
	if !again {
		return late
	}
	actx, cancel := context.WithTimeout(ctx, l.followerTimeout())
	defer cancel()
	g, ok, err := l.client.Acquire(actx, l.cfg.Key, l.cfg.Identity, l.cfg.LeaseDuration)
	if err != nil || !ok {
		return late
	}
	return l.beginTerm(ctx, g, false)
}

// lose ends t after the server said its grant is gone, and forgets it. A
// term whose deadline has passed ends with lease.ErrLocalDeadline, as
// lease.Term.Renew ends it, whether or not its deadline timer has run yet.
func (l *Lock) lose(t *lease.Term, cause error) {
	if !l.client.Clock().Now().Before(t.Deadline()) {
		cause = lease.ErrLocalDeadline
	}
	t.End(cause)
	l.drop(t)
}

// drop forgets t (ended) if it is still the lock's term.
func (l *Lock) drop(t *lease.Term) {
	l.mu.Lock()
	if l.term == t {
		l.term = nil
	}
	l.mu.Unlock()
}

// giveBack releases the grant of t after its term ended locally; a lost
// grant needs no release.
func (l *Lock) giveBack(ctx context.Context, t *lease.Term) error {
	err := t.Release(ctx)
	if err != nil && !errors.Is(err, lease.ErrLost) {
		return err // keep the grant: the next Update tries again
	}
	l.drop(t)
	if err == nil {
		l.mu.Lock()
		l.obs = rawRecord{Key: l.cfg.Key, Epoch: t.Grant().Epoch + 1}
		l.mu.Unlock()
	}
	return nil
}

// release is Update with an empty HolderIdentity. The term ends (everything
// acting under it is told) before the server frees the key. A release that
// fails on a dead connection is sent once more (lease.Client.Release).
func (l *Lock) release(ctx context.Context) error {
	l.op.Lock()
	defer l.op.Unlock()
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	if t == nil {
		return fmt.Errorf("resourcelock: release of %s: %w", l.cfg.Key, ErrNotHolding)
	}
	err := t.Release(ctx)
	switch {
	case err == nil:
	case errors.Is(err, lease.ErrLost):
		l.drop(t)
		return fmt.Errorf("resourcelock: nothing to release: %w", err)
	default:
		return err
	}
	l.drop(t)
	l.mu.Lock()
	l.obs = rawRecord{Key: l.cfg.Key, Epoch: t.Grant().Epoch + 1}
	l.mu.Unlock()
	return nil
}

func (l *Lock) notify(old, new lease.Token) {
	if l.cfg.OnEpochChange == nil {
		return
	}
	l.hookMu.Lock()
	defer l.hookMu.Unlock()
	l.cfg.OnEpochChange(old, new)
}
