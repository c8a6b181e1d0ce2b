package resourcelock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Causes with which a Term's context ends (context.Cause). A term that the
// server ended carries the lease package's error instead (it matches
// lease.ErrLost and one of lease.ErrLapsed, lease.ErrNotOwner,
// lease.ErrEpochMismatch).
var (
	// ErrReleased: the lock released the grant (Update with an empty
	// HolderIdentity, that is client-go's ReleaseOnCancel).
	ErrReleased = errors.New("resourcelock: grant released")
	// ErrLocalDeadline: no renewal arrived before the term's local deadline
	// (Grant.ValidUntil minus Options.Margin); the grant may still be held on
	// the server, but this process can no longer prove it.
	ErrLocalDeadline = errors.New("resourcelock: local deadline of the grant passed without renewal")
	// ErrNotHolding: the lock holds no live term (TokenContext).
	ErrNotHolding = errors.New("resourcelock: this lock holds no live term")
)

// Term is one grant as this lock holds it: one epoch, from the Create or
// Update that obtained it to the moment it ended. Renewals extend a term;
// they never change its epoch. A term ends exactly once, for one of these
// reasons (context.Cause of Context):
//
//   - the server said the grant is gone (lease.ErrLapsed, lease.ErrNotOwner,
//     lease.ErrEpochMismatch), on a renew or seen by a Get;
//   - the lock released it (ErrReleased);
//   - its local deadline passed without a renewal (ErrLocalDeadline).
//
// An ended term never comes back: a later grant, even with the same
// identity, is a new Term with a greater epoch.
type Term struct {
	token  lease.Token
	ctx    context.Context
	cancel context.CancelCauseFunc
	end    func(cause error) // ends once; see Lock.newTerm

	mu       sync.Mutex
	deadline time.Time // local monotonic instant: ValidUntil - margin
	timer    *time.Timer
	ended    bool
}

// Token is the term's fencing token.
func (t *Term) Token() lease.Token { return t.token }

// Epoch is the term's epoch.
func (t *Term) Epoch() int64 { return t.token.Epoch }

// Context carries the term's token (lease.TokenFromContext) and is done when
// the term ends; context.Cause tells why.
func (t *Term) Context() context.Context { return t.ctx }

// Done is closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.ctx.Done() }

// Err is nil while the term lasts, then the reason it ended.
func (t *Term) Err() error {
	if t.ctx.Err() == nil {
		return nil
	}
	return context.Cause(t.ctx)
}

// Deadline is the local instant (with a monotonic reading) up to which the
// term is certainly held, less the lock's margin, as of its last renewal.
// The term ends there unless a renewal moves it.
func (t *Term) Deadline() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadline
}

// Valid reports whether the term has not ended and its deadline is ahead.
func (t *Term) Valid() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.ended && time.Now().Before(t.deadline)
}

// extend moves the deadline to d after a renewal. It returns false when the
// term has already ended (or its old deadline fired meanwhile): the renewal
// came too late to continue this term.
func (t *Term) extend(d time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended || !t.timer.Stop() {
		return false
	}
	if !time.Now().Before(d) {
		return false
	}
	t.deadline = d
	t.timer.Reset(time.Until(d))
	return true
}

func (t *Term) markEnded() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false
	}
	t.ended = true
	t.timer.Stop()
	return true
}
