package resourcelock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
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
		l := mustLock(t, newClient(t, dsn), key, id, resourcelock.Options{
			LeaseDuration: testTTL, OnEpochChange: e.hook(id), Waiter: w,
			Candidacy: &lease.Candidacy{Strategy: lease.StrategyNewestVersion, Version: version, Ready: ready},
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
			st, cs, err := obs.Candidates(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cs {
				if c.Rank > 0 {
					got = append(got, c.Owner)
				}
			}
			return st == lease.StrategyNewestVersion && joinIDs(got) == joinIDs(want)
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
