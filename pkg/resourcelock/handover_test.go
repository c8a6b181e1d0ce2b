package resourcelock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// Handover with unmodified client-go: candidates registered through the
// lock's Candidacy, strategy newest_version. When the leader stops
// (ReleaseOnCancel), its release grants the key to the ready candidate with
// the newest version, epoch + 1, in the same transaction; that candidate's
// waiting Get returns a record naming itself, client-go's Update takes up
// the grant, and no other candidate ever starts a term. A candidate that is
// not ready is passed over.
func TestClientGoHandoverToNewestReadyCandidate(t *testing.T) {
	dsn := newDB(t)
	e := newElection(t)
	const key = "handover"
	w := newWaiter(t, dsn)
	lock := func(id, version string, ready func() bool) *resourcelock.Lock {
		l := mustLock(t, newClient(t, dsn), key, id, resourcelock.Config{
			LeaseDuration: testTTL, OnEpochChange: e.hook(id), Waiter: w,
			Candidacy: &handover.Candidacy{Strategy: handover.StrategyNewestVersion, Version: version, Ready: ready},
		})
		e.mu.Lock()
		e.locks[id] = l
		e.mu.Unlock()
		return l
	}
	obs := newClient(t, dsn)
	// registered waits until the key's candidates ranked by the strategy
	// are exactly want, in order.
	registered := func(want ...string) {
		t.Helper()
		pgtest.Eventually(t, time.Minute, "candidates ranked "+joinIDs(want), func() bool {
			st, cs, err := handover.Candidates(context.Background(), obs, key)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cs {
				if c.Rank > 0 {
					got = append(got, c.Owner)
				}
			}
			return st == handover.StrategyNewestVersion && joinIDs(got) == joinIDs(want)
		})
	}

	old := runCandidate(t, lock("old", "1.0.0", nil), true)
	first := e.nextStart(t, "the first leader")
	if first.tok.Owner != "old" {
		t.Fatalf("first leader %v, want old", first.tok)
	}
	<-old.started

	var newReady atomic.Bool
	mid := runCandidate(t, lock("mid", "1.5.0", nil), true)
	newest := runCandidate(t, lock("new", "2.0.0", newReady.Load), true)
	registered("mid") // new is registered but not ready: not choosable
	newReady.Store(true)
	registered("new", "mid")

	stop := time.Now()
	old.stop()
	if end := e.next(t, "the old leader's end"); end.start || end.tok != first.tok {
		t.Fatalf("after stopping the leader: %+v, want the end of %v", end, first.tok)
	}
	next := e.nextStart(t, "the successor")
	t.Logf("handover %v -> %v in %v", first.tok, next.tok, next.at.Sub(stop).Round(time.Millisecond))
	if next.tok.Owner != "new" || next.tok.Epoch != first.tok.Epoch+1 {
		t.Fatalf("successor %v, want new with epoch %d (granted by the release)", next.tok, first.tok.Epoch+1)
	}
	if tok := <-newest.started; tok != next.tok {
		t.Fatalf("client-go's OnStartedLeading saw %v, want %v", tok, next.tok)
	}
	// client-go renews the handed grant under its epoch.
	handed, err := obs.Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, time.Minute, "a renewal of the handed grant", func() bool {
		s, err := obs.Inspect(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Held || s.Owner != "new" || s.Epoch != next.tok.Epoch {
			t.Fatalf("key %+v while new leads epoch %d", s, next.tok.Epoch)
		}
		return s.ExpiresAt.After(handed.ExpiresAt)
	})
	select {
	case tok := <-mid.started:
		t.Fatalf("mid started a term (%v): the handover went to new only", tok)
	default:
	}

	// new steps down too: mid, the only ready candidate left, gets it.
	newest.stop()
	e.next(t, "new's end")
	last := e.nextStart(t, "mid's term")
	if last.tok.Owner != "mid" || last.tok.Epoch != next.tok.Epoch+1 {
		t.Fatalf("successor %v, want mid with epoch %d", last.tok, next.tok.Epoch+1)
	}
}

func joinIDs(ids []string) string { return strings.Join(ids, ",") }

// A candidate waits from its first Get while another holds the key, and
// when it turns ready it registers as ready inside that Get, which keeps
// waiting: returning would put it to sleep for client-go's RetryPeriod,
// deaf to a grant handed to it meanwhile. The handed grant then ends that
// same Get, with a record naming the candidate.
func TestWaitingCandidateRegistersReadinessAndKeepsWaiting(t *testing.T) {
	dsn := newDB(t)
	const key = "ready-in-wait"
	leader := newClient(t, dsn)
	g, ok, err := leader.Acquire(context.Background(), key, "leader", testTTL)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	var ready atomic.Bool
	l := mustLock(t, newClient(t, dsn), key, "cand", resourcelock.Config{
		LeaseDuration: testTTL, Waiter: newWaiter(t, dsn),
		Candidacy: &handover.Candidacy{Strategy: handover.StrategyNewestVersion, Version: "2.0.0", Ready: ready.Load},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct {
		holder string
		err    error
	}
	done := make(chan got, 1)
	go func() {
		r, _, err := l.Get(ctx)
		if err != nil {
			done <- got{err: err}
			return
		}
		done <- got{holder: r.HolderIdentity}
	}()
	obs := newClient(t, dsn)
	isReady := func() bool {
		_, cs, err := handover.Candidates(context.Background(), obs, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs) == 1 && cs[0].Owner == "cand" && cs[0].Ready && cs[0].Rank == 1
	}
	pgtest.Eventually(t, time.Minute, "cand registered, not ready", func() bool {
		_, cs, err := handover.Candidates(context.Background(), obs, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs) == 1 && cs[0].Owner == "cand" && !cs[0].Ready
	})
	ready.Store(true)
	pgtest.Eventually(t, time.Minute, "cand registered as a ready candidate", isReady)
	select {
	case r := <-done:
		t.Fatalf("the candidate's Get returned while another held the key: %+v", r)
	default:
	}
	if err := leader.Release(context.Background(), g.Token); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.holder != "cand" {
			t.Fatalf("Get after the handover: %+v, want a record naming cand", r)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting Get did not return after the release handed the key to cand")
	}
}
