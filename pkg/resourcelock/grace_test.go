package resourcelock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/resourcelock"
)

// TestFollowersWakeWhenGraceEnds: three client-go electors, each with a
// Waiter, start on a key during the grace after a (simulated) promotion. The
// acquire is denied with the grace's end, and the next follower Get sleeps
// until then: one leads right after the grace. Before 0.4.0 the waiting Get
// waited for a change of the record, which the end of a grace is not, until
// its 10-minute bound.
func TestFollowersWakeWhenGraceEnds(t *testing.T) {
	ctx := pgtest.Context(t, 0)
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn)
	// The SQL embedded in this build (no shared extension files).
	if err := leaseadmin.InstallSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"SELECT lease.configure(max_ttl => '3s')", "UPDATE lease.timeline_state SET timeline = 0",
		"UPDATE lease.leases SET life = life - interval '1 day'", "CHECKPOINT"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	w := newWaiter(t, dsn)
	started := make(chan string, 3)
	for i := range 3 {
		id := fmt.Sprintf("c%d", i)
		lock := mustLock(t, newClient(t, dsn), "k", id, resourcelock.Config{LeaseDuration: 3 * time.Second, Waiter: w})
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: "k", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { started <- id },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); le.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	var id string
	select {
	case id = <-started:
	case <-time.After(time.Minute):
		t.Fatal("no leader within a minute of a 3s grace")
	}
	var graceUntil, acquiredAt time.Time
	if err := pool.QueryRow(ctx, `SELECT s.grace_until, l.acquired_at FROM lease.status() s, lease.list() l
	    WHERE l.key = 'k'`).Scan(&graceUntil, &acquiredAt); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s led; granted %v after the grace ended (server clock)", id, acquiredAt.Sub(graceUntil).Round(time.Millisecond))
	if acquiredAt.Before(graceUntil) {
		t.Fatalf("granted at %v, before the grace ended at %v", acquiredAt, graceUntil)
	}
}
