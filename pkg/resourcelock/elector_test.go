package resourcelock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/client-go/tools/leaderelection"
)

// Timings of the elector tests: short, whole-second LeaseDuration (client-go
// computes LeaseDurationSeconds by truncation).
const (
	testTTL           = 2 * time.Second
	testRenewDeadline = 1500 * time.Millisecond
	testRetryPeriod   = 300 * time.Millisecond
)

// election watches the terms of several candidates' locks and checks, at
// every start of a term, that no other candidate's lock would still hand out
// a token, and that epochs strictly increase.
type election struct {
	t     *testing.T
	mu    sync.Mutex
	locks map[string]*resourcelock.Lock
	terms []termEvent // starts and ends, in the order the hooks ran
	last  int64       // highest epoch started
	ch    chan termEvent
}

type termEvent struct {
	start bool
	tok   lease.Token
	at    time.Time
}

func newElection(t *testing.T) *election {
	return &election{t: t, locks: map[string]*resourcelock.Lock{}, ch: make(chan termEvent, 100)}
}

func (e *election) hook(id string) func(old, new lease.Token) {
	return func(old, new lease.Token) {
		e.mu.Lock()
		defer e.mu.Unlock()
		now := time.Now()
		if old.Epoch != 0 {
			e.terms = append(e.terms, termEvent{tok: old, at: now})
			e.ch <- termEvent{tok: old, at: now}
		}
		if new.Epoch == 0 {
			return
		}
		for other, l := range e.locks {
			if tok, ok := l.Token(); ok && other != id {
				e.t.Errorf("%s starts epoch %d while %s still holds a valid token %v", id, new.Epoch, other, tok)
			}
		}
		if new.Epoch <= e.last {
			e.t.Errorf("%s starts epoch %d, not above the last epoch started, %d", id, new.Epoch, e.last)
		}
		e.last = new.Epoch
		e.terms = append(e.terms, termEvent{start: true, tok: new, at: now})
		e.ch <- termEvent{start: true, tok: new, at: now}
	}
}

func (e *election) lock(t *testing.T, dsn, key, id string) *resourcelock.Lock {
	l := mustLock(t, newClient(t, dsn), key, id,
		resourcelock.Config{LeaseDuration: testTTL, OnEpochChange: e.hook(id)})
	e.mu.Lock()
	e.locks[id] = l
	e.mu.Unlock()
	return l
}

// next waits for the next term event.
func (e *election) next(t *testing.T, what string) termEvent {
	t.Helper()
	select {
	case ev := <-e.ch:
		return ev
	case <-time.After(time.Minute):
		t.Fatalf("no term event within a minute, waiting for %s", what)
	}
	panic("unreachable")
}

func (e *election) nextStart(t *testing.T, what string) termEvent {
	t.Helper()
	for {
		if ev := e.next(t, what); ev.start {
			return ev
		}
	}
}

// candidate runs a real client-go LeaderElector on lock until ctx ends.
type candidate struct {
	lock    *resourcelock.Lock
	cancel  context.CancelFunc
	done    chan struct{}
	started chan lease.Token // a token per OnStartedLeading
}

func runCandidate(t *testing.T, lock *resourcelock.Lock, releaseOnCancel bool) *candidate {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{lock: lock, cancel: cancel, done: make(chan struct{}), started: make(chan lease.Token, 10)}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            lock.Key(),
		LeaseDuration:   testTTL,
		RenewDeadline:   testRenewDeadline,
		RetryPeriod:     testRetryPeriod,
		ReleaseOnCancel: releaseOnCancel,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				tok, _ := lock.Token()
				c.started <- tok
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		le.Run(ctx)
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *candidate) stop() {
	c.cancel()
	<-c.done
}

// Several candidates, each a real client-go elector with its own Lock and
// pool; the leader steps down (ReleaseOnCancel) and rejoins. Exactly one
// leader at a time, strictly increasing epochs, and each handoff by release
// gives the successor the released epoch + 2 (release, then grant: no lapse
// was waited for).
func TestElectorHandoffs(t *testing.T) {
	dsn := newDB(t)
	e := newElection(t)
	const key = "handoffs"
	cands := map[string]*candidate{}
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		cands[id] = runCandidate(t, e.lock(t, dsn, key, id), true)
	}
	prev := e.nextStart(t, "the first leader")
	for handoff := 0; handoff < 4; handoff++ {
		leader := cands[prev.tok.Owner]
		if tok := <-leader.started; tok != prev.tok {
			t.Fatalf("OnStartedLeading saw token %v, the term started was %v", tok, prev.tok)
		}
		stepDown := time.Now()
		leader.stop() // ReleaseOnCancel: release, then Run returns
		end := e.next(t, "the leader's term to end")
		if end.start || end.tok != prev.tok {
			t.Fatalf("after stepping down: %+v, want the end of %v", end, prev.tok)
		}
		next := e.nextStart(t, "a successor")
		t.Logf("handoff %d: %v → %v in %v (TTL %v)", handoff, prev.tok, next.tok, next.at.Sub(stepDown).Round(time.Millisecond), testTTL)
		if next.tok.Owner == prev.tok.Owner {
			t.Fatalf("the candidate that stepped down leads again")
		}
		if next.tok.Epoch != prev.tok.Epoch+2 {
			t.Fatalf("successor epoch %d after the release of %d: want %d (release + grant)", next.tok.Epoch, prev.tok.Epoch, prev.tok.Epoch+2)
		}
		// The one that stepped down rejoins as a follower.
		cands[prev.tok.Owner] = runCandidate(t, e.locks[prev.tok.Owner], true)
		prev = next
	}
}

// The leader stops without releasing (as if its process died): a follower
// takes over once the grant lapses, with exactly the next epoch, and the old
// lock no longer hands out a token by then.
func TestElectorTakeoverAfterLeaderStops(t *testing.T) {
	dsn := newDB(t)
	e := newElection(t)
	const key = "takeover"
	cands := map[string]*candidate{}
	for _, id := range []string{"a", "b", "c"} {
		cands[id] = runCandidate(t, e.lock(t, dsn, key, id), false)
	}
	first := e.nextStart(t, "the first leader")
	stopped := time.Now()
	cands[first.tok.Owner].stop() // no release
	var ended bool
	for {
		ev := e.next(t, "a takeover")
		if !ev.start {
			if ev.tok != first.tok {
				t.Fatalf("unexpected end %v", ev.tok)
			}
			ended = true
			if _, ok := e.locks[first.tok.Owner].Token(); ok {
				t.Fatal("an ended term still hands out its token")
			}
			continue
		}
		if !ended {
			t.Fatalf("epoch %d started before the old term %v ended", ev.tok.Epoch, first.tok)
		}
		if ev.tok.Epoch != first.tok.Epoch+1 {
			t.Fatalf("takeover epoch %d, want %d (lapse, then grant)", ev.tok.Epoch, first.tok.Epoch+1)
		}
		t.Logf("takeover %v → %v %v after the leader stopped (TTL %v, RetryPeriod %v)",
			first.tok, ev.tok, ev.at.Sub(stopped).Round(time.Millisecond), testTTL, testRetryPeriod)
		return
	}
}

// The leader's grant lapses on the server (its clock jumps past the expiry)
// while client-go still leads; client-go's next renew fails, and its
// fallback re-acquires with the same identity. For client-go this is one
// continuous leadership (OnStartedLeading runs once); the lock makes it a
// new epoch, and the old epoch's contexts are cancelled before the new one
// is handed out.
func TestElectorLapseThenReacquireSameIdentity(t *testing.T) {
	srv, dsn := fakeClockDB(t)
	const key = "relapse"

	var (
		mu      sync.Mutex
		calls   []string
		oldCtx  context.Context
		newTerm = make(chan lease.Token, 1)
	)
	var lock *resourcelock.Lock
	lock = mustLock(t, newClient(t, dsn), key, "a", resourcelock.Config{LeaseDuration: testTTL,
		OnEpochChange: func(old, new lease.Token) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, fmt.Sprintf("(%d,%d)", old.Epoch, new.Epoch))
			if new.Epoch == 0 || oldCtx == nil {
				return
			}
			// A new epoch is being handed out: everything under the old one
			// must already have been told.
			if oldCtx.Err() == nil {
				t.Errorf("epoch %d handed out while the old epoch's context is live", new.Epoch)
			}
			newTerm <- new
		}})
	c := runCandidate(t, lock, true)
	first := <-c.started
	ctx, cancel, err := lock.TokenContext(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	mu.Lock()
	oldCtx = ctx
	mu.Unlock()

	jumped := time.Now()
	if err := srv.SetClockOffset(time.Hour); err != nil { // the server passes the expiry
		t.Fatal(err)
	}
	var second lease.Token
	select {
	case second = <-newTerm:
	case <-time.After(time.Minute):
		t.Fatal("no new epoch within a minute")
	}
	t.Logf("lapse at %v; re-acquired %v → %v %v later; hook calls %v", first, first, second,
		time.Since(jumped).Round(time.Millisecond), calls)
	// The lock never released the old epoch before its deadline, so its
	// cause is one of the two ways a lock learns of a lapse (the package's
	// rule, see the documentation): the server answering lapsed to a renewal
	// before the local deadline, or the local deadline, which a renewal in
	// flight across the jump meets at once (its renewed grant is already
	// past its expiry on the server's clock) and a late one meets when the
	// machine is loaded. Never "released by the holder", whichever
	// goroutine notices first.
	if cause := context.Cause(ctx); !errors.Is(cause, lease.ErrLapsed) && !errors.Is(cause, lease.ErrLocalDeadline) {
		t.Fatalf("old epoch's context ended with %v, want lapsed or the local deadline", cause)
	}
	if second.Owner != "a" || second.Epoch != first.Epoch+1 {
		t.Fatalf("re-acquired %v after %v", second, first)
	}
	select {
	case tok := <-c.started:
		t.Fatalf("client-go started leading again (%v): expected one continuous leadership", tok)
	case <-time.After(3 * testRetryPeriod):
	}
	// client-go keeps renewing the new epoch.
	pgtest.Eventually(t, time.Minute, "a renewal of the new epoch", func() bool {
		tok, ok := lock.Token()
		return ok && tok == second
	})
}
