package listen

// Changes: the one wake loop of the module. Await, AwaitAcquire, a
// sharded controller's loop and the CLI's watch wait for any of many keys
// to change or become free through it.

import (
	"context"
	"time"

	"k8s.io/utils/clock"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Changes is a subscription to the changes of a set of keys, and the wait
// for the next one: a notification for one of the keys, a resync, an
// instant on a clock (the earliest expiry of the held keys, a poll), or a
// kick. Make one with Subscribe; Close it when done. Its methods are for
// one goroutine at a time.
type Changes struct {
	w      *Waiter
	clk    clock.Clock
	events <-chan Event // nil: no Waiter, or it was closed
	cancel context.CancelFunc
}

// Subscribe subscribes to the changes of keys (every key when none is
// given) on w, and returns once they are registered (see Waiter.Watch): a
// change committed after Subscribe returns wakes the next Wait. w may be
// nil; then Wait wakes only at its instant, a kick or the context's end.
// Timers run on clk. The subscription ends with ctx or Close.
func Subscribe(ctx context.Context, w *Waiter, clk clock.Clock, keys ...string) *Changes {
	ch := &Changes{w: w, clk: clk, cancel: func() {}}
	if w != nil {
		wctx, cancel := context.WithCancel(ctx)
		ch.events, ch.cancel = w.watch(wctx, true, keys), cancel
	}
	return ch
}

// Close ends the subscription.
func (ch *Changes) Close() { ch.cancel() }

// Wake says what ended a Wait.
type Wake struct {
	// Events are the notifications received (EventResync among them), in
	// the order the server committed them. Any role may NOTIFY pg_lease:
	// an event is a sign that its key may have changed, not a state.
	Events []Event
	// Due: the instant passed.
	Due bool
	// Kicked: the kick channel was received from.
	Kicked bool
	// Closed: the Waiter was closed. Read again; from now on only the
	// instant, a kick or the context wakes the wait.
	Closed bool

	seqs []uint64 // each event's dispatch count (shared reads and acquires)
}

// after is the dispatch count of the last event of wk that skip does not
// skip (0: none): a read or an acquire begun after it was dispatched saw
// every change those events stand for.
func (wk Wake) after(skip func(Event) bool) uint64 {
	for i := len(wk.Events) - 1; i >= 0; i-- {
		if skip == nil || !skip(wk.Events[i]) {
			return wk.seqs[i]
		}
	}
	return 0
}

// Resync reports whether notifications may have been missed: an
// EventResync arrived, or the Waiter was closed. Read every key again.
func (wk Wake) Resync() bool {
	if wk.Closed {
		return true
	}
	for _, ev := range wk.Events {
		if ev.Type == EventResync {
			return true
		}
	}
	return false
}

// Wait waits until a notification or resync for one of the keys, the
// instant until on the clock (zero: none), a receive from kick (nil: none)
// or the end of ctx, whose cause it returns then. A notification wakes it
// with every event queued behind it: one read covers them all.
func (ch *Changes) Wait(ctx context.Context, until time.Time, kick <-chan struct{}) (Wake, error) {
	if ctx.Err() != nil {
		return Wake{}, context.Cause(ctx)
	}
	var due <-chan time.Time
	if !until.IsZero() {
		t := ch.clk.NewTimer(max(until.Sub(ch.clk.Now()), 0))
		defer t.Stop()
		due = t.C()
	}
	var wk Wake
	select {
	case <-ctx.Done():
		return Wake{}, context.Cause(ctx)
	case <-due:
		wk.Due = true
	case <-kick:
		wk.Kicked = true
	case ev, ok := <-ch.events:
		if !ok {
			ch.events, wk.Closed = nil, true
			break
		}
		wk.add(ev)
		wk.Closed = ch.drain(&wk)
	}
	return wk, nil
}

// Queued returns, without waiting, the events queued for the subscription
// since the last Wait or Queued (none: no Events). Closed: the Waiter was
// closed.
func (ch *Changes) Queued() Wake {
	var wk Wake
	if ch.events != nil {
		wk.Closed = ch.drain(&wk)
	}
	return wk
}

func (wk *Wake) add(ev Event) {
	wk.seqs = append(wk.seqs, ev.seq)
	ev.seq = 0
	wk.Events = append(wk.Events, ev)
}

// drain adds the events already queued; true when the channel closed.
func (ch *Changes) drain(wk *Wake) (closed bool) {
	for {
		select {
		case ev, ok := <-ch.events:
			if !ok {
				ch.events = nil
				return true
			}
			wk.add(ev)
		default:
			return false
		}
	}
}

// WakeAt is the earliest of until (zero: none) and the local instants at
// which the grants held in states certainly expire unless renewed
// (lease.State.ExpiresLocal, never early): a lapse sends no notification.
func WakeAt(until time.Time, states ...lease.State) time.Time {
	for _, s := range states {
		if at := s.ExpiresLocal(); !at.IsZero() && (until.IsZero() || at.Before(until)) {
			until = at
		}
	}
	return until
}
