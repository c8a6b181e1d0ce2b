package elector_test

import (
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// TestHandoverToTheChosenCandidate: electors with a Candidacy (strategy
// priority). When the leader's Run ends, its release grants the key to the
// ready candidate with the highest priority, epoch + 1 (no free state in
// between), and that elector starts its term without a race: the other
// candidate never leads. The successor is woken by the handover's
// notification: its poll and the TTL outlast the test.
func TestHandoverToTheChosenCandidate(t *testing.T) {
	dsn := installed(t, nil)
	pool := newPool(t, dsn)
	client := lease.New(pool)
	w, err := listen.NewWaiter(testCtx(t), pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	retry := 15 * time.Minute
	r := newRecorder()
	mk := func(id string, priority int32) *elector.Elector {
		var el *elector.Elector
		el, err := elector.New(lease.New(newPool(t, dsn)), elector.Config{
			Key: "handover", Identity: id, TTL: 50 * time.Minute, RetryInterval: retry, Waiter: w,
			Candidacy: &handover.Candidacy{Strategy: handover.StrategyPriority, Priority: priority},
			Callbacks: r.callbacks(id, &el, nil),
		})
		if err != nil {
			t.Fatal(err)
		}
		return el
	}
	stopA := runElector(t, mk("a", 0))
	ta := waitTerm(t, r.events, time.Minute)
	if ta.id != "a" {
		t.Fatalf("first term %s", ta.id)
	}
	stopB := runElector(t, mk("b", 1))
	defer stopB()
	stopC := runElector(t, mk("c", 5))
	defer stopC()
	pgtest.Eventually(t, time.Minute, "b and c registered", func() bool {
		_, cs, err := handover.Candidates(testCtx(t), client, "handover")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range cs {
			if c.Rank > 0 && c.Owner != "a" {
				n++
			}
		}
		return n == 2
	})

	cancelled := time.Now()
	stopA() // returns after a's release
	tc := waitTerm(t, r.events, time.Minute)
	handoff := tc.start.Sub(cancelled)
	if tc.id != "c" || tc.token.Epoch != ta.token.Epoch+1 {
		t.Fatalf("successor %s at epoch %d, want c at %d (granted by a's release)", tc.id, tc.token.Epoch, ta.token.Epoch+1)
	}
	if handoff >= retry {
		t.Errorf("handover took %v: c was not woken by it (poll interval %v)", handoff, retry)
	}
	t.Logf("handover a -> c after cancel: %v", handoff.Round(time.Millisecond))
	select {
	case ev := <-r.events:
		t.Fatalf("another term started: %s at epoch %d", ev.id, ev.token.Epoch)
	case <-time.After(500 * time.Millisecond):
	}
}
