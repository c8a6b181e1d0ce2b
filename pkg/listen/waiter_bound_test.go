package listen_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/listen"
)

// waitEvent reads events until one of typ for key comes; it fails the test
// when none has within a minute.
func waitEvent(t *testing.T, events <-chan listen.Event, typ listen.EventType, key, when string) {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("%s: the channel closed before %s of %s", when, typ, key)
			}
			if ev.Type == typ && ev.Key == key {
				return
			}
		case <-timeout.C:
			t.Fatalf("%s: no %s of %s within a minute (its change was not notified)", when, typ, key)
		}
	}
}

// TestWatchBeyondTheRegistrationBound: the server holds at most 1000
// registrations of keys per session (54000 beyond). When the waiter's
// session holds 1000 (made here directly, as the superuser test role), a
// Watch of one more key makes the waiter register '*' beside them, so a
// change of that key is notified too (the poll and the TTL are far out).
func TestWatchBeyondTheRegistrationBound(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{})
		rec.next(t, listen.Listening)
		if _, err := db.pool.Exec(ctx, `INSERT INTO lease.listeners (pid, key, since)
			SELECT a.pid, 'filler-' || i, clock_timestamp()
			  FROM pg_stat_activity a, generate_series(1, 1000) i
			 WHERE a.application_name = 'pg_lease waiter' AND a.datname = current_database()`); err != nil {
			t.Fatal(err)
		}
		events := w.Watch(ctx, "beyond")
		if n := registrations(t, db, "*"); n != 1 {
			t.Fatalf("%d registrations of '*' after a Watch beyond the bound, want 1", n)
		}
		if _, ok, err := db.c.Acquire(ctx, "beyond", "holder", never); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waitEvent(t, events, listen.EventAcquired, "beyond", "a key beyond the bound")
	})
}

// TestWatchAllEndsKeepsKeys: lease.unlisten('*') drops every registration
// of the backend, so when a Watch of every key ends, the waiter keeps '*'
// while a Watch of one key stays; that key's changes are still notified.
func TestWatchAllEndsKeepsKeys(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{})
		rec.next(t, listen.Listening)
		one := w.Watch(ctx, "kept")
		actx, endAll := context.WithCancel(ctx)
		all := w.Watch(actx)
		endAll()
		for range all { // closed when its context ends
		}
		// A key whose linger starts after the end of the Watch of every
		// key: once it is dropped, the linger of '*' has passed too.
		tctx, endTick := context.WithCancel(ctx)
		w.Watch(tctx, "tick")
		endTick()
		rec.nextFor(t, listen.Unlisten, "tick")
		// A Watch returns once registered: after the pass that dropped tick.
		w.Watch(ctx, "probe")
		if n := registrations(t, db, "kept"); n != 1 {
			t.Fatalf("%d registrations of kept after the Watch of every key ended, want 1", n)
		}
		if _, ok, err := db.c.Acquire(ctx, "kept", "holder", never); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waitEvent(t, one, listen.EventAcquired, "kept", "after the Watch of every key ended")
	})
}
