package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func TestWatchShowsALeaseMovingBetweenHolders(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)

	p := start(t, ctx, dsnEnv(dsn), "watch", "job-42")
	p.waitFor(t, "held           job-42  holder=worker-a1 epoch=1", false)

	// a1 releases, b2 acquires with a short TTL and lets it lapse, a1 takes over.
	if err := c.Release(ctx, lease.Token{Key: "job-42", Owner: "worker-a1", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "released       job-42  holder=worker-a1 epoch=1", false)
	acquire(t, ctx, c, "job-42", "worker-b2", 500*time.Millisecond)
	p.waitFor(t, "acquired       job-42  holder=worker-b2 epoch=3", false)
	p.waitFor(t, "lapsed         job-42  holder=worker-b2 epoch=3", false)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)
	p.waitFor(t, "takeover       job-42  holder=worker-a1 epoch=4", false)
	if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "job-42"); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "force_released job-42  holder=worker-a1 epoch=4", false)
	// Another key is not shown.
	acquire(t, ctx, c, "job-43", "worker-a1", time.Minute)
	time.Sleep(200 * time.Millisecond)
	p.stopOK(t, "watch")
	if strings.Contains(p.out.String(), "job-43") {
		t.Fatalf("watch job-42 showed job-43:\n%s", p.out.String())
	}
}

// watch shows a renewal before the old expiry passes (renewals send no
// notification). The grant here lasts 10 minutes: the renewal must
// show long before.
func TestWatchShowsRenewalsWhenTheyHappen(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	g := acquire(t, ctx, c, "job-42", "worker-a1", 10*time.Minute)

	p := start(t, ctx, dsnEnv(dsn), "watch", "--poll", "200ms")
	p.waitFor(t, "held           job-42  holder=worker-a1 epoch=1", false)
	if _, err := c.Renew(ctx, g.Token, 20*time.Minute); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "renewed        job-42  holder=worker-a1 epoch=1", false)
	p.stop()
	p.wait(t)
}

// watch survives a PostgreSQL restart (FATAL: terminating connection …
// 57P01). It says so, reconnects, says so, and goes on.
func TestWatchSurvivesServerRestart(t *testing.T) {
	ctx := testCtx(t)
	srv := pgtest.New(t)
	if err := srv.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, dsnEnv(dsn), "install")
	func() {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		// One server without standbys, as its operator would configure
		// it: the restart moves the epoch base, with no grace (in mode
		// 'any', no new grant for max_ttl after it).
		if _, err := conn.Exec(ctx, "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
			t.Fatal(err)
		}
		acquire(t, ctx, lease.New(conn), "job-42", "worker-a1", time.Minute)
	}()

	p := start(t, ctx, dsnEnv(dsn), "watch", "job-42")
	p.waitFor(t, "held           job-42  holder=worker-a1 epoch=1", false)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "watch: connection lost", true)
	p.waitFor(t, "watch: reconnected", true)

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	c := lease.New(conn)
	if err := c.Release(ctx, lease.Token{Key: "job-42", Owner: "worker-a1", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	// The release line, not the "held" line printed before the restart:
	// acquiring before watch has seen the release would show a takeover.
	// The waiter may still be reconnecting: then watch's poll finds it.
	p.waitFor(t, "released       job-42  holder=worker-a1 epoch=1", false)
	// The first grant after the restart is above the base the restart
	// moved to (the era's first restart): 2^24 + 1.
	acquire(t, ctx, c, "job-42", "worker-b2", time.Minute)
	p.waitFor(t, "acquired       job-42  holder=worker-b2 epoch=16777217", false)
	p.stopOK(t, "watch after the restart")
	if n := strings.Count(p.err.String(), "\n"); n != 2 {
		t.Errorf("watch stderr: %d lines, want 2 (lost, reconnected):\n%s", n, p.err.String())
	}
	_ = context.Background
}

// Another role than the installer's watches: the lapse and its holder come
// from the functions every role may call.
func TestWatchShowsTheLapseToEveryRole(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	viewer := role(t, ctx, "pglease_watcher")
	p := start(t, ctx, dsnEnv(pgtest.WithUser(dsn, viewer)), "-v", "watch", "job-42")
	p.waitFor(t, "watch: subscribed", true)
	acquire(t, ctx, c, "job-42", "worker-b2", 300*time.Millisecond)
	p.waitFor(t, "acquired       job-42  holder=worker-b2 epoch=1", false)
	p.waitFor(t, "lapsed         job-42  holder=worker-b2 epoch=1", false)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)
	p.waitFor(t, "takeover       job-42  holder=worker-a1 epoch=2", false)
	p.stopOK(t, "watch")
}

// A grant so short that it lapsed before watch read it still shows as
// acquired, then lapsed.
func TestWatchShowsAGrantThatLapsedBeforeItWasRead(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	p := start(t, ctx, dsnEnv(dsn), "-v", "watch")
	p.waitFor(t, "watch: subscribed", true)
	acquire(t, ctx, c, "job-42", "worker-b2", time.Millisecond)
	p.waitFor(t, "acquired       job-42  holder=worker-b2 epoch=1", false)
	p.waitFor(t, "lapsed         job-42  holder=worker-b2 epoch=1", false)
	p.stop()
	p.wait(t)
}

// A key that lapsed before watch started shows as lapsed with its holder,
// and a key watch sees lapse is printed once, at its expiry.
func TestWatchShowsAKeyLapsedBeforeItStarted(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "job-41", "worker-c3", 100*time.Millisecond)
	pgtest.WaitLapsed(t, c, "job-41", time.Minute)
	acquire(t, ctx, c, "job-42", "worker-b2", 2*time.Second)
	p := start(t, ctx, dsnEnv(dsn), "watch", "--poll", "0")
	p.waitFor(t, "lapsed         job-41  holder=worker-c3 epoch=1", false)
	p.waitFor(t, "held           job-42  holder=worker-b2 epoch=1", false)
	// --poll 0: only the expiry timer reads again, so this line shows
	// that watch woke at the grant's expiry on its own.
	p.waitFor(t, "lapsed         job-42  holder=worker-b2 epoch=1", false)
	p.stopOK(t, "watch")
	if n := strings.Count(p.out.String(), "lapsed         job-42"); n != 1 {
		t.Fatalf("job-42's lapse printed %d times:\n%s", n, p.out.String())
	}
}

// Any role may NOTIFY pg_lease. A role with no grant at all sends a forged
// release and a forced release of a held key, a grant of a key nobody
// holds, and a payload naming a key the server refuses: watch reads each
// key and prints none of it (the key stays held), and goes on to show a
// real grant made after them.
func TestWatchIgnoresForgedNotifications(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)
	p := start(t, ctx, dsnEnv(dsn), "watch")
	p.waitFor(t, "held           job-42  holder=worker-a1 epoch=1", false)

	forger := role(t, ctx, "pglease_forger")
	fc, _ := connect(t, ctx, pgtest.WithUser(dsn, forger))
	for _, payload := range []string{
		`{"event":"released","key":"job-42","owner":"worker-a1","epoch":1}`,
		`{"event":"force_released","key":"job-42","owner":"worker-a1","epoch":1}`,
		`{"event":"acquired","key":"job-43","owner":"eve","epoch":7}`,
		`{"event":"handover","key":"job-42","owner":"eve","epoch":2}`,
		`{"event":"released","key":"` + strings.Repeat("k", 2000) + `","owner":"x","epoch":1}`,
	} {
		if _, err := fc.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
			t.Fatal(err)
		}
	}
	// Notifications arrive in commit order: once the real grant shows, watch
	// has handled the forged ones.
	acquire(t, ctx, c, "job-44", "worker-b2", time.Minute)
	p.waitFor(t, "acquired       job-44  holder=worker-b2 epoch=1", false)
	p.stopOK(t, "watch")
	out := p.out.String()
	if strings.Count(out, "job-42") != 1 || strings.Contains(out, "job-43") || strings.Contains(out, "eve") {
		t.Fatalf("watch printed forged events:\n%s", out)
	}
	if s, err := c.Inspect(ctx, "job-42"); err != nil || !s.Held || s.Owner != "worker-a1" {
		t.Fatalf("job-42: %+v %v", s, err)
	}
}
