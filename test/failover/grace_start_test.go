package failover

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestGraceRunsFromPromotion: after a real promotion the grace is measured
// from when the new timeline began (the checkpoint the promotion requests at
// once), not from the first grant path after it. Nothing calls pg_lease for
// 3 s after the promotion; the first acquire is denied with a grace that
// ends at most max_ttl + 1 s (the checkpoint's time is whole seconds) after
// that checkpoint was seen, and no earlier than max_ttl after the promotion
// began: every grant the old primary made before then has ended by that
// time. Before 0.4.0 it ended max_ttl after that acquire, 3 s later.
func TestGraceRunsFromPromotion(t *testing.T) {
	const maxTTL = 6 * time.Second
	_, _, st := newPair(t, maxTTL)
	ctx := pgtest.Context(t, 3*time.Minute)
	conn := pgtest.Connect(t, dsn(st))
	var before time.Time
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// The checkpoint the promotion requested, on the new timeline.
	var seen time.Time
	pgtest.Eventually(t, time.Minute, "a checkpoint on the promoted server's new timeline", func() bool {
		var on bool
		err := conn.QueryRow(ctx, `SELECT c.timeline_id = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
		    clock_timestamp() FROM pg_control_checkpoint() c`).Scan(&on, &seen)
		if err != nil {
			t.Fatal(err)
		}
		return on
	})
	pgtest.WaitServerPast(t, conn, seen.Add(3*time.Second))
	_, ok, err := lease.New(conn).Acquire(ctx, "k", "a", time.Second)
	var ge *lease.GraceError
	if ok || !errors.As(err, &ge) {
		t.Fatalf("first acquire 3 s after the promotion: ok=%t err=%v, want a GraceError", ok, err)
	}
	t.Logf("promotion began after %s, its checkpoint seen at %s, grace until %s",
		before.Format(time.RFC3339Nano), seen.Format(time.RFC3339Nano), ge.Until.Format(time.RFC3339Nano))
	if ge.Until.Before(before.Add(maxTTL)) {
		t.Fatalf("grace ends %v after the promotion began, want at least max_ttl %v", ge.Until.Sub(before), maxTTL)
	}
	if limit := seen.Add(time.Second + maxTTL); ge.Until.After(limit) {
		t.Fatalf("grace ends %v after the promotion's checkpoint was seen, want at most max_ttl + 1 s: measured from the first grant path, not the promotion",
			ge.Until.Sub(seen))
	}
}
