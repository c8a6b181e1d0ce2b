package shard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/shard"
)

// TestLeaveWithdrawsCandidaciesAtTheStop: a replica stopped while its
// statements are held back withdraws its handover candidacies at the stop,
// not once they return. Another owner leaving meanwhile (two replicas
// stopped at once) hands its shards to a live replica, not to the leaver,
// which would hold them without working on them until its statements
// returned.
func TestLeaveWithdrawsCandidaciesAtTheStop(t *testing.T) {
	c := newCluster(t, 16, 10*time.Minute) // no grant lapses during the test
	c.renew = 200 * time.Millisecond
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	gate := &stmtGate{match: []string{"lease.list()", "lease.renew_many("}, held: map[string]int{}}
	defer gate.open()
	a := c.start("a")
	live := c.start("c")
	b := c.startTraced("b", gate)
	c.waitSettled("a", "b", "c")
	owners := c.last
	afterA := shard.Balance(c.n, []string{"b", "c"}, owners)
	c.waitRunnersUp(owners, afterA, "a")
	var toB []int
	for s := range c.n {
		if owners[s] == "a" && afterA[s] == "b" {
			toB = append(toB, s)
		}
	}
	if len(toB) == 0 {
		t.Fatalf("b is the runner-up of none of a's shards (%v, then %v)", owners, afterA)
	}
	bOwner := b.r.Owner()

	gate.close()
	waitFor(t, "b's round list and its renewal held back", gate.heldAll)
	b.cancel(context.Canceled)
	for _, s := range toB {
		waitFor(t, fmt.Sprintf("b's candidacy for shard %d withdrawn while its statements are held back", s), func() bool {
			_, cands, err := handover.Candidates(ctx, lc, shard.Key("ctl", s))
			if err != nil {
				t.Fatal(err)
			}
			for _, cs := range cands {
				if cs.Owner == bOwner {
					return false
				}
			}
			return true
		})
	}
	a.cancel(context.Canceled)
	for _, s := range toB {
		waitFor(t, fmt.Sprintf("c acting under shard %d while b's statements are held back", s), func() bool { return live.r.Owns(s) })
	}
	select {
	case <-b.done:
		t.Fatal("b's Run returned while its statements were held back: the gate tested nothing")
	default:
	}
	gate.open()
	<-b.done
	<-a.done
	if keys := heldBy(t, lc, bOwner); len(keys) > 0 {
		t.Errorf("b holds %v after its Run returned", keys)
	}
	c.waitSettled("c")
	c.checkNoOverlap()
}
