package listen

// Reads and acquires that the waits of one Waiter share: a herd of waiters
// of one key in one process costs one statement per wake-up, not one each.

import (
	"context"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// readKey names what the waits of one Waiter may share: a key, through one
// client (so one database and one role).
type readKey struct {
	c   *lease.Client
	key string
}

// sharedRead is one Inspect of a key, shared by the Awaits that the same
// notification woke.
type sharedRead struct {
	seq  uint64 // events dispatched when the read began
	done chan struct{}
	st   lease.State
	err  error
}

// sharedReads are the reads in flight. They have a lock of their own: the
// listener never touches them.
type sharedReads struct {
	mu sync.Mutex
	m  map[readKey]*sharedRead
}

// inspect reads key through c. It joins a read of the same key and client
// that began once after events were dispatched (seq: the count now), and
// so after the change that woke the caller committed. Otherwise it starts
// one. The read runs to its end (bounded by timeout) for the others, even
// if the caller stops waiting.
func (rs *sharedReads) inspect(ctx context.Context, c *lease.Client, key string, after, seq uint64, timeout time.Duration, joined func()) (lease.State, error) {
	k := readKey{c, key}
	rs.mu.Lock()
	r := rs.m[k]
	join := r != nil && r.seq >= after
	if !join {
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
	if join {
		joined()
	}
	select {
	case <-r.done:
		return r.st, r.err
	case <-ctx.Done():
		return lease.State{}, ctx.Err()
	}
}

// sharedAcquire is one Acquire of a key for one waiter, whose outcome the
// other waiters woken by the same notification take as theirs to learn:
// the key is now held, by that waiter or by someone else.
type sharedAcquire struct {
	seq   uint64 // events dispatched when the acquire began
	gen   uint64 // acquires begun (through this Waiter) before, and with, it
	owner string
	done  chan struct{}
	g     lease.Grant
	ok    bool
	err   error
	// abandoned: the acquiring waiter stopped waiting before an answer;
	// the others decide nothing from it.
	abandoned bool
}

// sharedAcquires are the acquires of the AwaitAcquires of one Waiter, per
// key and client: the last one begun, in flight or answered, kept while an
// AwaitAcquire of that key runs (their own lock).
type sharedAcquires struct {
	mu  sync.Mutex
	m   map[readKey]*acquireSlot
	gen uint64 // acquires begun
}

type acquireSlot struct {
	waiters int            // AwaitAcquires of the key running
	last    *sharedAcquire // the last acquire begun
}

// enter and leave count the AwaitAcquires of key through c; the last to
// leave drops the key's slot.
func (as *sharedAcquires) enter(c *lease.Client, key string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	k := readKey{c, key}
	if as.m == nil {
		as.m = map[readKey]*acquireSlot{}
	}
	if as.m[k] == nil {
		as.m[k] = &acquireSlot{}
	}
	as.m[k].waiters++
}

func (as *sharedAcquires) leave(c *lease.Client, key string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	k := readKey{c, key}
	if sl := as.m[k]; sl != nil {
		if sl.waiters--; sl.waiters <= 0 {
			delete(as.m, k)
		}
	}
}

// begun is the number of acquires begun so far.
func (as *sharedAcquires) begun() uint64 {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.gen
}

// acquire acquires key through c for owner, for ttl, or takes the last
// acquire of the same key and client, in flight or answered, when join
// accepts it (one begun after the change that woke the caller). Unlike a
// shared read, an acquire runs on the acquiring waiter's ctx: a grant is
// the caller's to use, never made for a waiter that has gone. The caller
// has entered key.
func (as *sharedAcquires) acquire(ctx context.Context, c *lease.Client, key, owner string, ttl time.Duration, seq uint64, join func(*sharedAcquire) bool, joined func()) *sharedAcquire {
	k := readKey{c, key}
	as.mu.Lock()
	sl := as.m[k]
	if a := sl.last; a != nil && join(a) {
		as.mu.Unlock()
		joined()
		select {
		case <-a.done:
		case <-ctx.Done():
			return &sharedAcquire{abandoned: true, err: ctx.Err()}
		}
		return a
	}
	as.gen++
	a := &sharedAcquire{seq: seq, gen: as.gen, owner: owner, done: make(chan struct{})}
	sl.last = a
	as.mu.Unlock()
	a.g, a.ok, a.err = c.Acquire(ctx, key, owner, ttl)
	a.abandoned = a.err != nil && ctx.Err() != nil
	close(a.done)
	return a
}
