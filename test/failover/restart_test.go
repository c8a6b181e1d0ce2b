package failover

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestStandbyEndedWithoutPromotion: an asynchronous standby ended by a
// restart without standby.signal (a hand-run disaster recovery step instead
// of pg_ctl promote) comes up as a primary on the same timeline, without the
// primary's last commits: here a grant of epoch 3 that never reached it. Its
// postmaster is not the one pg_lease recorded, so the first grant path moves
// the epoch base to the era's next restart: epoch 3 is never issued again, and in mode 'any' no new
// grant is made before max_ttl has passed since that postmaster started.
// The holder of the lost epoch 3 can no longer renew. (Before, the ended
// standby granted epoch 3 again at once while its holder still believed it.)
func TestStandbyEndedWithoutPromotion(t *testing.T) {
	const maxTTL = 3 * time.Second
	_, p, st := newPair(t, maxTTL)
	ctx := pgtest.Context(t, 2*time.Minute)
	old := lease.New(pgtest.Connect(t, dsn(p)))
	g1, ok, err := old.Acquire(ctx, "k", "a", maxTTL)
	if err != nil || !ok || g1.Epoch != 1 {
		t.Fatalf("a's acquire: %+v %v %v", g1, ok, err)
	}
	if err := old.Release(ctx, g1.Token); err != nil {
		t.Fatal(err)
	}
	cutOff(t, ctx, p, st)
	g2, ok, err := old.Acquire(ctx, "k", "b", maxTTL)
	if err != nil || !ok || g2.Epoch != 3 {
		t.Fatalf("b's acquire on the primary alone: %+v %v %v", g2, ok, err)
	}
	tl, err := p.Timeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := st.EndWithoutPromotion(ctx); err != nil {
		t.Fatal(err)
	}
	if now, err := st.Timeline(ctx); err != nil || now != tl {
		t.Fatalf("the ended standby is on timeline %d (%v), the primary was on %d: want the same (no promotion)", now, err, tl)
	}

	conn := pgtest.Connect(t, dsn(st))
	c := lease.New(conn)
	var started time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil {
		t.Fatal(err)
	}
	g, ok, err := c.Acquire(ctx, "k", "c", maxTTL)
	var ge *lease.GraceError
	if !errors.As(err, &ge) || ok {
		t.Fatalf("c's acquire on the ended standby: %+v ok=%t err=%v; want a GraceError (b still believes epoch %d)", g, ok, err, g2.Epoch)
	}
	if want := started.Add(maxTTL); !ge.Until.Equal(want) {
		t.Fatalf("grace until %v, want the postmaster start %v + max_ttl", ge.Until, started)
	}
	g, err = c.AcquireWait(ctx, "k", "c", maxTTL, time.Minute)
	if err != nil || g.Epoch != 1<<24+1 {
		t.Fatalf("c's blocking acquire: %+v %v; want epoch 2^24+1 (the era's first restart) after the grace", g, err)
	}
	var afterGrace bool
	if err := conn.QueryRow(ctx, `SELECT l.acquired_at >= s.grace_until FROM lease.leases l, lease.status() s
  WHERE l.key = 'k'`).Scan(&afterGrace); err != nil || !afterGrace {
		t.Fatalf("c's grant made before the grace ended (%v)", err)
	}
	if _, err := c.Renew(ctx, g2.Token, maxTTL); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("b's renew of the lost epoch %d on the ended standby: %v, want it lost", g2.Epoch, err)
	}
	t.Logf("ended standby: c granted epoch %d (restart %d of era %d) %v after its postmaster started; the lost grant had epoch %d",
		g.Epoch, g.Epoch>>24&0xffff, g.Epoch>>40, g.ExpiresAt.Add(-maxTTL).Sub(started).Round(time.Millisecond), g2.Epoch)
}
