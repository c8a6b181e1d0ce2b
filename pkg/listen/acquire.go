package listen

// AwaitAcquire: the wait of a follower that takes the key when it can,
// sharing its acquires with the other waiters of its Waiter.

import (
	"context"
	"fmt"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// AwaitAcquire waits until owner holds key and returns the grant. It
// acquires key for owner for ttl (lease.Client.Acquire, wait 0) whenever
// the key may be free, and waits as Await does in between: it reads the
// key first, then acts again only on a notification for it, a resync, the
// observed grant's expiry, or poll after it last learned the key's state.
// A grant it finds handed to owner (a handover) it confirms with an
// acquire, which returns that grant.
//
// The waiters of one Waiter (one key, one client) send one statement per
// wake-up between them, not one each. A release or force-release wakes
// them with one acquire, for the waiter that asks first; the others learn
// from its answer (in flight or given, when it began after the release was
// notified) that the key is held, by that waiter or by another process,
// and keep waiting. A handover or a resync wakes them with one
// shared read. A notification of a grant wakes no read while the key is
// known held: it cannot free the key. A denial (wait 0) says the key is
// held, or that its row was busy: unless a grant is notified within a
// second (grantNotice), they read then. After a denial the holder's expiry
// is not known: the next read comes at the earlier of poll and ttl (as if
// the holder's TTL were owner's), later by at most that much than a read
// at the expiry would have been.
//
// A waiter that does not get the key keeps waiting. During the grace after
// a promotion (lease.ErrGrace) it waits the grace out (WaitOutGrace) and
// acquires then. It returns an acquire's or a read's error, or ctx's cause
// when ctx ends. w may be nil: then it polls. Timers run on c's clock.
func AwaitAcquire(ctx context.Context, w *Waiter, c *lease.Client, key, owner string, ttl, poll time.Duration) (lease.Grant, error) {
	if err := checkAcquire(key, owner, ttl, poll); err != nil {
		return lease.Grant{}, err
	}
	clk := c.Clock()
	ch := Subscribe(ctx, w, clk, key)
	defer ch.Close()
	if w != nil {
		w.acquires.enter(c, key)
		defer w.acquires.leave(c, key)
	}
	aw := &acquirer{w: w, c: c, key: key, owner: owner, ttl: ttl, poll: poll}
	var (
		wk   Wake
		join func(*sharedAcquire) bool // non-nil: the next pass acquires; otherwise it reads
	)
	for {
		var (
			g     lease.Grant
			until time.Time
			again bool
			err   error
		)
		var confirm time.Time // a denial: read then, unless a grant was notified
		if join != nil {
			g, until, confirm, again, err = aw.acquire(ctx, join)
		} else {
			g, until, confirm, again, err = aw.read(ctx, wk)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return lease.Grant{}, fmt.Errorf("listen: await acquire %q: %w", key, context.Cause(ctx))
		case err != nil:
			return lease.Grant{}, err
		case g.Owner != "":
			return g, nil
		case again:
			// At once (after a grace, or an acquire its waiter abandoned):
			// only an acquire begun from now on will do.
			join = aw.since()
			continue
		}
		for {
			if wk, err = ch.Wait(ctx, earliest(until, confirm), nil); err != nil {
				return lease.Grant{}, fmt.Errorf("listen: await acquire %q: %w", key, err)
			}
			if len(wk.Events) == 0 || wk.after(isGrant) != 0 || wk.Closed {
				break
			}
			// Only grants: the key is held.
			confirm = time.Time{}
		}
		// Freed (and maybe granted since): acquire, sharing an acquire
		// begun after the last release. Anything else (a handover, a
		// resync, an unknown event, the timer): read.
		join = nil
		if after := wk.after(isGrant); !wk.Closed && after != 0 && wk.after(isFreeOrGrant) == 0 {
			join = func(a *sharedAcquire) bool { return a.seq >= after }
		}
	}
}

func checkAcquire(key, owner string, ttl, poll time.Duration) error {
	if err := lease.CheckKey(key); err != nil {
		return fmt.Errorf("listen: AwaitAcquire: %w", err)
	}
	if err := lease.CheckOwner(owner); err != nil {
		return fmt.Errorf("listen: AwaitAcquire %q: %w", key, err)
	}
	if ttl < time.Microsecond || poll <= 0 {
		return fmt.Errorf("listen: AwaitAcquire %q: %w: ttl and poll must be positive, got %v and %v", key, lease.ErrInvalidInput, ttl, poll)
	}
	return nil
}

// isGrant: a notification of a grant, which cannot free a held key.
func isGrant(ev Event) bool { return ev.Type == EventAcquired }

// isFreeOrGrant: a notification that the key was freed, or a grant.
func isFreeOrGrant(ev Event) bool {
	return ev.Type == EventReleased || ev.Type == EventForceReleased || ev.Type == EventAcquired
}

// acquirer is one AwaitAcquire's call.
type acquirer struct {
	w          *Waiter
	c          *lease.Client
	key, owner string
	ttl, poll  time.Duration
}

// since accepts the acquires begun from now on.
func (aw *acquirer) since() func(*sharedAcquire) bool {
	if aw.w == nil {
		return func(*sharedAcquire) bool { return false }
	}
	begun := aw.w.acquires.begun()
	return func(a *sharedAcquire) bool { return a.gen > begun }
}

// read reads the key (shared when a notification woke it) and acquires it
// when it is free or handed to owner. It returns the grant, or when to
// read next; again: acquire at once.
func (aw *acquirer) read(ctx context.Context, wk Wake) (g lease.Grant, until, confirm time.Time, again bool, err error) {
	st, err := read(ctx, aw.w, aw.c, aw.key, wk)
	if err != nil {
		return lease.Grant{}, time.Time{}, time.Time{}, false, err
	}
	now := aw.c.Clock().Now()
	switch {
	case !st.Held:
		// Free when read: an acquire begun since will do.
		return aw.acquire(ctx, aw.since())
	case st.Owner == aw.owner:
		// Handed over to owner (or held by it already): the acquire
		// returns that grant.
		g, ok, err := aw.c.Acquire(ctx, aw.key, aw.owner, aw.ttl)
		if err != nil || ok {
			return g, time.Time{}, time.Time{}, false, err
		}
	}
	return lease.Grant{}, WakeAt(now.Add(aw.poll), st), time.Time{}, false, nil
}

// acquire acquires the key, or takes the answer of an acquire for another
// waiter of the Waiter that join accepts. It returns the grant, or when to
// read next, and after a denial when to read unless a grant is notified
// first; again: acquire at once (after the grace, or the other waiter
// stopped waiting before an answer).
func (aw *acquirer) acquire(ctx context.Context, join func(*sharedAcquire) bool) (g lease.Grant, until, confirm time.Time, again bool, err error) {
	var a *sharedAcquire
	if aw.w == nil {
		a = &sharedAcquire{owner: aw.owner}
		a.g, a.ok, a.err = aw.c.Acquire(ctx, aw.key, aw.owner, aw.ttl)
	} else {
		a = aw.w.acquires.acquire(ctx, aw.c, aw.key, aw.owner, aw.ttl, aw.w.subs.dispatched(), join,
			func() { aw.w.emit.emit(sigAcquireShared, aw.key) })
	}
	now := aw.c.Clock().Now()
	var none time.Time
	switch {
	case a.abandoned && ctx.Err() == nil:
		return lease.Grant{}, none, none, true, nil
	case a.err != nil:
		if WaitOutGrace(ctx, aw.c, a.err) && ctx.Err() == nil {
			return lease.Grant{}, none, none, true, nil
		}
		return lease.Grant{}, none, none, false, a.err
	case a.ok && a.owner == aw.owner:
		return a.g, none, none, false, nil
	case a.ok:
		// Another waiter here holds it, until at most its TTL from now.
		return lease.Grant{}, now.Add(min(aw.poll, a.g.TTL)), none, false, nil
	}
	if aw.w != nil {
		aw.w.reached()
	}
	// Denied: held by another owner, or its row was busy (wait 0 does not
	// wait for a row lock), maybe with nobody granted. The grant's
	// notification confirms the former.
	return lease.Grant{}, now.Add(min(aw.poll, aw.ttl)), now.Add(min(aw.poll, aw.ttl, grantNotice)), false, nil
}

// grantNotice is how long after a denial AwaitAcquire waits for the
// notification of the grant that denied it before it reads the key.
const grantNotice = time.Second

// earliest is the earlier of two instants; zero stands for none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
