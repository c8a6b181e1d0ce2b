package listen

// The wake policies (Await, WaitOutGrace) and the reads the Awaits of one
// Waiter share.

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// It subscribes (Watch, which registers key with lease.listen) before the
// first read. So a change committed after that read always wakes it, unless
// pg_lease.notify is off. Each read is bounded by the Waiter's QueryTimeout
// (10 s without a Waiter): a silently dead connection cannot stall it. It
// returns the read's error, or ctx's cause when ctx ends. A read that
// succeeds while w has no connection makes w reconnect at once, instead of
// at the end of its backoff. w may be nil; then
// Await polls. Timers run on c's clock.
func (w *Waiter) Await(ctx context.Context, c *lease.Client, key string, poll time.Duration, done func(lease.State) bool) (lease.State, error) {
	if poll <= 0 {
		return lease.State{}, fmt.Errorf("listen: Await %q: %w: poll must be positive, got %v", key, lease.ErrInvalidInput, poll)
	}
	var events <-chan Event
	callTimeout := 10 * time.Second
	if w != nil {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events = w.Watch(wctx, key)
		callTimeout = w.opts.QueryTimeout
	}
	clk := c.Clock()
	var after uint64 // the events dispatched when this Await woke
	shared := false  // woken by an event: a read begun since then will do
	for {
		var (
			st  lease.State
			err error
		)
		if shared {
			st, err = w.sharedInspect(ctx, c, key, after, callTimeout)
		} else {
			ictx, cancel := context.WithTimeout(ctx, callTimeout)
			st, err = c.Inspect(ictx, key)
			cancel()
		}
		shared = false
		if err != nil {
			if ctx.Err() != nil {
				return lease.State{}, fmt.Errorf("listen: await %q: %w", key, context.Cause(ctx))
			}
			return lease.State{}, err
		}
		if w != nil {
			w.reached() // a Waiter still in its reconnection backoff connects now
		}
		if done(st) {
			return st, nil
		}
		wake := poll
		if at := st.ExpiresLocal(); !at.IsZero() {
			wake = min(wake, max(at.Sub(clk.Now()), 0))
		}
		timer := clk.NewTimer(wake)
		select {
		case <-ctx.Done():
			timer.Stop()
			return lease.State{}, fmt.Errorf("listen: await %q: %w", key, context.Cause(ctx))
		case _, ok := <-events:
			if !ok {
				events = nil // the Waiter was closed: poll from now on
				break
			}
			latest(events)
			after, shared = w.dispatched(), true
		case <-timer.C():
		}
		timer.Stop()
	}
}

// latest drains the events already queued: one read covers them all.
func latest(events <-chan Event) {
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// readKey names the reads Awaits of one Waiter may share.
type readKey struct {
	c   *lease.Client
	key string
}

// sharedRead is one Inspect of a key, shared by the Awaits that the same
// notification woke. A herd of followers of one key in one process costs one
// read per notification, not one per follower.
type sharedRead struct {
	seq  uint64 // events dispatched when the read began
	done chan struct{}
	st   lease.State
	err  error
}

// sharedReads are the reads in flight that the Awaits of one Waiter share.
// They have a lock of their own: the listener never touches them.
type sharedReads struct {
	mu sync.Mutex
	m  map[readKey]*sharedRead
}

// sharedInspect reads key through c. It joins a read of the same key and
// client that began after the first after events were dispatched, and so
// after the change that woke the caller committed. Otherwise it starts one.
// The read runs to its end (bounded by timeout) for the others, even if the
// caller stops waiting.
func (w *Waiter) sharedInspect(ctx context.Context, c *lease.Client, key string, after uint64, timeout time.Duration) (lease.State, error) {
	k := readKey{c, key}
	seq := w.dispatched() // read before the read begins: never newer than it
	rs := &w.reads
	rs.mu.Lock()
	r := rs.m[k]
	joined := r != nil && r.seq >= after
	if !joined {
		r = &sharedRead{seq: seq, done: make(chan struct{})}
		if rs.m == nil {
			rs.m = map[readKey]*sharedRead{}
		}
		rs.m[k] = r
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		go func() {
			defer cancel()
			r.st, r.err = c.Inspect(rctx, key)
			rs.mu.Lock()
			if rs.m[k] == r {
				delete(rs.m, k)
			}
			rs.mu.Unlock()
			close(r.done)
		}()
	}
	rs.mu.Unlock()
	if joined {
		w.event("read_shared", key)
	}
	select {
	case <-r.done:
		return r.st, r.err
	case <-ctx.Done():
		return lease.State{}, ctx.Err()
	}
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
