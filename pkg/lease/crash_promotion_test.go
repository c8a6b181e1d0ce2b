package lease_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestRenewalRecordsPromotionAfterCrashRestart: one postmaster can write on
// two timelines. A backend crash reinitializes the server without a new
// postmaster (pg_postmaster_start_time() stays), and with standby.signal in
// the data directory the server comes back as a standby; promoted, it
// writes on a new timeline. The holder's row was granted by the same
// postmaster on the timeline before, and its first renewal must still
// record the promotion and start the grace (specs/SEMANTICS.md).
func TestRenewalRecordsPromotionAfterCrashRestart(t *testing.T) {
	srv := pgtest.New(t, pgtest.Options{Settings: map[string]string{"restart_after_crash": "on"}})
	ctx := testCtx(t)
	db := newDBOn(t, srv, installModes[0])
	configure(t, db.pool, "max_ttl => '10 min'")
	g, ok, err := db.c.Acquire(ctx, "k", "a", 10*time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var started, startedAfter time.Time
	var tl, tlAfter int64
	if err := db.pool.QueryRow(ctx, "SELECT pg_postmaster_start_time(), lease._timeline()").Scan(&started, &tl); err != nil {
		t.Fatal(err)
	}

	// standby.signal, owned like the data directory, then a backend crash.
	sig := filepath.Join(srv.DataDir(), "standby.signal")
	if err := os.WriteFile(sig, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(srv.DataDir()); err == nil {
		st := fi.Sys().(*syscall.Stat_t)
		if err := os.Chown(sig, int(st.Uid), int(st.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	victim := connect(t, db.dsn)
	if err := syscall.Kill(int(victim.PgConn().PID()), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	db.pool.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rec, err := srv.InRecovery(ctx)
		if err == nil && rec {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not come back as a standby: in recovery %t, %v", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := srv.PromoteSQL(ctx); err != nil {
		t.Fatal(err)
	}

	pool := newPool(t, db.dsn)
	if err := pool.QueryRow(ctx, "SELECT pg_postmaster_start_time(), lease._timeline()").Scan(&startedAfter, &tlAfter); err != nil {
		t.Fatal(err)
	}
	if !startedAfter.Equal(started) || tlAfter <= tl {
		t.Fatalf("postmaster start %v -> %v, timeline %d -> %d: want the same postmaster on a later timeline",
			started, startedAfter, tl, tlAfter)
	}
	if _, err := lease.New(pool).Renew(ctx, g.Token, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	var recorded, inGrace bool
	if err := pool.QueryRow(ctx, `SELECT timeline = lease._timeline(), coalesce(grace_until > clock_timestamp(), false)
	    FROM lease.status()`).Scan(&recorded, &inGrace); err != nil {
		t.Fatal(err)
	}
	if !recorded || !inGrace {
		t.Fatalf("after the renewal: timeline recorded %t, grace running %t; want both", recorded, inGrace)
	}
}
