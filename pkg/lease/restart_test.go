package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestRestartMovesEpochBaseAndStartsGrace: a server restarted on the same
// timeline (a restarted primary, or a standby ended without a promotion,
// which SQL cannot tell apart) may lack its last commits, so a grant after
// the restart is above a higher epoch base, the era's first restart (2^24:
// no epoch of the previous life is issued again), and in promotion mode 'any'
// no new grant is made before the grace (max_ttl) has passed since the
// postmaster started. Renewals go on meanwhile. In mode 'synchronous' the
// base moves and the next grant is made at once. (Before, the restarted
// server granted at once from the same base: a lost epoch could be issued
// again; here the freed key got epoch 3 at once.)
func TestRestartMovesEpochBaseAndStartsGrace(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{FakeClock: true})
	ctx := testCtx(t)
	type setup struct {
		name  string
		mode  pgtest.Install
		sync  bool
		dsn   string
		held  lease.Token
		freed lease.Token
	}
	dbs := []*setup{
		{name: "any/extension", mode: installModes[0]},
		{name: "any/schema", mode: installModes[1]},
		{name: "synchronous", mode: installModes[0], sync: true},
	}
	for _, d := range dbs {
		db := newDBOn(t, srv, d.mode)
		d.dsn = db.dsn
		if d.sync {
			configure(t, db.pool, "promotion => 'synchronous'")
		}
		g, ok, err := db.c.Acquire(ctx, "freed", "a", time.Minute)
		if err != nil || !ok || g.Epoch != 1 {
			t.Fatalf("%s: acquire: %+v %t %v", d.name, g, ok, err)
		}
		if err := db.c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		d.freed = g.Token
		if g, ok, err = db.c.Acquire(ctx, "held", "a", 10*time.Minute); err != nil || !ok {
			t.Fatalf("%s: acquire: %t %v", d.name, ok, err)
		}
		d.held = g.Token
		db.pool.Close()
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}

	var started time.Time
	for _, d := range dbs {
		pool := newPool(t, d.dsn)
		c := lease.New(pool)
		if err := pool.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil {
			t.Fatal(err)
		}
		g, ok, err := c.Acquire(ctx, "freed", "b", time.Minute)
		if d.sync {
			if err != nil || !ok || g.Epoch != 1<<24+1 {
				t.Fatalf("%s: acquire after the restart: %+v ok=%t err=%v, want epoch 2^24+1 (the era's first restart) at once", d.name, g, ok, err)
			}
			continue
		}
		var ge *lease.GraceError
		if !errors.As(err, &ge) || ok {
			t.Fatalf("%s: acquire of a free key after the restart: %+v ok=%t err=%v, want a GraceError", d.name, g, ok, err)
		}
		if want := started.Add(time.Hour); !ge.Until.Equal(want) {
			t.Fatalf("%s: grace until %v, want the postmaster start %v + max_ttl (1 h)", d.name, ge.Until, started)
		}
		var era, restarts int64
		if err := pool.QueryRow(ctx, `SELECT era, restarts FROM lease.timeline_state
  ORDER BY era DESC, restarts DESC LIMIT 1`).Scan(&era, &restarts); err != nil || era != 0 || restarts != 1 {
			t.Fatalf("%s: era %d, restarts %d after the restart (%v), want 0 and 1", d.name, era, restarts, err)
		}
		// The holder's renewals go on during the grace, with its epoch.
		if r, err := c.Renew(ctx, d.held, 10*time.Minute); err != nil || r.Epoch != d.held.Epoch {
			t.Fatalf("%s: renew during the grace: %+v %v", d.name, r, err)
		}

		// A blocking acquire waits out the grace: the server's clock is
		// moved past it while the acquire polls.
		res := make(chan lease.Grant, 1)
		errc := make(chan error, 1)
		go func() {
			g, err := c.AcquireWait(ctx, "freed", "b", time.Minute, 3*time.Hour)
			res <- g
			errc <- err
		}()
		waitBackend(t, pool, "%lease.acquire%", "PgSleep")
		if err := srv.SetClockOffset(time.Hour + time.Second); err != nil {
			t.Fatal(err)
		}
		g, err = <-res, <-errc
		if err != nil || g.Epoch != 1<<24+1 {
			t.Fatalf("%s: blocking acquire across the grace: %+v %v, want epoch 2^24+1", d.name, g, err)
		}
		var afterGrace bool
		var detail string
		if err := pool.QueryRow(ctx, `SELECT l.acquired_at >= s.grace_until, h.detail
  FROM lease.leases l, lease.status() s, lease.history('freed') h
 WHERE l.key = 'freed' AND h.event = 'promotion_grace'`).Scan(&afterGrace, &detail); err != nil {
			t.Fatal(err)
		}
		if !afterGrace || !strings.Contains(detail, "restart of the server") {
			t.Fatalf("%s: granted after the grace %t, history %q: want the grant after it and the restart named", d.name, afterGrace, detail)
		}
		if err := srv.SetClockOffset(0); err != nil {
			t.Fatal(err)
		}
	}
}
