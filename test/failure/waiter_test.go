package failure

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Clients waiting for a held key (a blocking acquire in progress, one in
// autocommit and one inside its client's open transaction) never delay the
// holder: a waiter keeps no row lock while it sleeps, so the holder, running
// with lock_timeout = 200ms, renews on time for longer than the waits last,
// the waiters time out with nothing granted, and the holder's release then
// hands the key at once to a new waiter, at the next epoch.
func TestWaitersNeverBlockHolder(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	ctx := pgtest.Context(t, time.Minute)
	admin := e.connect(t)
	hconn := e.connect(t)
	if _, err := hconn.Exec(ctx, `SET lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	holder := lease.New(hconn)
	const ttl, wait = 2 * time.Second, 2 * time.Second
	g := mustAcquire(t, holder, "w", "holder", ttl)

	// asleep waits until every backend in pids is inside pg_sleep: a waiter
	// that has gone once through its whole loop, so any lock it would take
	// before sleeping is taken. (A waiter queued behind another one's row
	// lock counts too: that is the defect this test is about, and the
	// holder's renewal below then fails on it.)
	asleep := func(pids ...uint32) {
		t.Helper()
		ids := make([]int64, len(pids))
		for i, p := range pids {
			ids[i] = int64(p)
		}
		pgtest.Eventually(t, 10*time.Second, "the waiters to sleep", func() bool {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE pid = ANY($1) AND (wait_event = 'PgSleep' OR wait_event_type = 'Lock')`, ids).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == len(ids)
		})
	}

	type res struct {
		who string
		g   lease.Grant
		err error
	}
	done := make(chan res, 2)
	c1 := e.connect(t)
	go func() {
		g, err := lease.New(c1).AcquireWait(ctx, "w", "w1", time.Minute, wait)
		done <- res{"w1 (autocommit)", g, err}
	}()
	c2 := e.connect(t)
	tx, err := c2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	go func() {
		g, err := lease.New(tx).AcquireWait(ctx, "w", "w2", time.Minute, wait)
		done <- res{"w2 (open transaction)", g, err}
	}()
	asleep(c1.PgConn().PID(), c2.PgConn().PID())

	// The holder renews every 200 ms until both waits are over and beyond.
	until := time.Now().Add(wait + time.Second)
	for n := 0; time.Now().Before(until); n++ {
		t0 := time.Now()
		if _, err := holder.Renew(ctx, g.Token, ttl); err != nil {
			t.Fatalf("holder's renewal %d while others wait for the key: %v (after %v)", n, err, time.Since(t0).Round(time.Millisecond))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := 0; i < 2; i++ {
		r := <-done
		if !errors.Is(r.err, lease.ErrWaitTimeout) {
			t.Errorf("%s: %v %v, want the wait to time out (the holder renewed throughout)", r.who, r.g.Token, r.err)
		}
	}
	if s := inspect(t, lease.New(admin), "w"); !s.Held || s.Owner != "holder" || s.Epoch != g.Epoch {
		t.Fatalf("after the waits: %s, want held by holder at epoch %d", stateString(s), g.Epoch)
	}

	// A release wakes a waiter at once: it gets the next epoch (the release
	// left the counter at epoch + 1, the grant is epoch + 2).
	c3 := e.connect(t)
	go func() {
		g, err := lease.New(c3).AcquireWait(ctx, "w", "w3", time.Minute, 10*time.Second)
		done <- res{"w3", g, err}
	}()
	asleep(c3.PgConn().PID())
	released := time.Now()
	if err := holder.Release(ctx, g.Token); err != nil {
		t.Fatalf("holder's release while another owner waits: %v (after %v)", err, time.Since(released).Round(time.Millisecond))
	}
	r := <-done
	if r.err != nil || r.g.Epoch != g.Epoch+2 {
		t.Fatalf("w3 after the release: %v %v, want epoch %d", r.g.Token, r.err, g.Epoch+2)
	}
	t.Logf("w3 got %v %v after the release", r.g.Token, time.Since(released).Round(time.Millisecond))
}
