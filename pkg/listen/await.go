package listen

// The wake policies: Await, AwaitAcquire, WaitOutGrace.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Await is the module's one wake policy for code that waits on a key: an
// elector's follower, a resourcelock follower's Get, the CLI's lock. It
// reads key through c (Inspect) and returns the first state for which done
// is true. It reads again only when the key may have changed:
//
//   - on a notification for key (a grant, a release, a force-release) or an
//     EventResync from w (notifications may have been missed);
//   - at the observed grant's expiry on the local clock (lease.State.ExpiresLocal,
//     never early), because a lapse sends no notification;
//   - poll after the last read. This bounds how late a change is seen when no
//     notification can arrive: w nil or closed, the listen connection down,
//     pg_lease.notify = off on the writer, a transaction-pooling proxy.
//
// A notification only wakes it: any role may NOTIFY pg_lease, so what its
// payload says is never handed to done. Every state done sees was read.
//
// It subscribes (Subscribe, which registers key with lease.listen) before
// the first read. So a change committed after that read always wakes it,
// unless pg_lease.notify is off. Awaits of one key through one client and
// one Waiter, woken by the same notification, share one read. Each read is
// bounded by the Waiter's QueryTimeout (10 s without a Waiter): a silently
// dead connection cannot stall it. It returns the read's error, or ctx's
// cause when ctx ends. A read that succeeds while w has no connection makes
// w reconnect at once, instead of at the end of its backoff. w may be nil;
// then Await polls. Timers run on c's clock.
func Await(ctx context.Context, w *Waiter, c *lease.Client, key string, poll time.Duration, done func(lease.State) bool) (lease.State, error) {
	if poll <= 0 {
		return lease.State{}, fmt.Errorf("listen: Await %q: %w: poll must be positive, got %v", key, lease.ErrInvalidInput, poll)
	}
	clk := c.Clock()
	ch := Subscribe(ctx, w, clk, key)
	defer ch.Close()
	var wk Wake // what woke the last wait (zero: none yet)
	for {
		st, err := read(ctx, w, c, key, wk)
		if err != nil {
			if ctx.Err() != nil {
				return lease.State{}, fmt.Errorf("listen: await %q: %w", key, context.Cause(ctx))
			}
			return lease.State{}, err
		}
		if done(st) {
			return st, nil
		}
		if wk, err = ch.Wait(ctx, WakeAt(clk.Now().Add(poll), st), nil); err != nil {
			return lease.State{}, fmt.Errorf("listen: await %q: %w", key, err)
		}
	}
}

// read reads key. Woken by a notification, it shares a read begun since
// with the other waits of w; otherwise (the first read, a timer, a closed
// Waiter) it reads on its own.
func read(ctx context.Context, w *Waiter, c *lease.Client, key string, wk Wake) (lease.State, error) {
	var (
		st  lease.State
		err error
	)
	if w != nil && len(wk.Events) > 0 {
		st, err = w.reads.inspect(ctx, c, key, wk.after(nil), w.subs.dispatched(), w.opts.QueryTimeout,
			func() { w.emit.emit(sigReadShared, key) })
	} else {
		ictx, cancel := context.WithTimeout(ctx, w.queryTimeout())
		st, err = c.Inspect(ictx, key)
		cancel()
	}
	if err == nil && w != nil {
		w.reached() // a Waiter still in its reconnection backoff connects now
	}
	return st, err
}

// WaitOutGrace is the one wake policy for the grace after a promotion: when
// err matches lease.ErrGrace it waits on c's clock until the grace has
// certainly ended (GraceError.UntilLocal) or ctx ends, and reports true; for
// any other err it returns false at once. Acquire again after it: the grace
// ends without any notification (nothing is written when it ends), so a
// Waiter would not wake for it, and asking again before it ends is denied.
func WaitOutGrace(ctx context.Context, c *lease.Client, err error) bool {
	var ge *lease.GraceError
	if !errors.As(err, &ge) {
		return false
	}
	clk := c.Clock()
	d := ge.UntilLocal.Sub(clk.Now())
	if d <= 0 {
		return true
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
	return true
}
