package pgbouncer

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/listen"
)

// testClient: every call of the lease client, a server-side
// blocking acquire, and fence.InTx (the caller's transaction) work through
// each pool mode; a stale token is refused and its function not called.
func testClient(t *testing.T, s *setup) {
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 0)
		pool := newPool(t, dsn)
		c := lease.New(pool)
		key := "client-" + mode
		g, ok, err := c.Acquire(ctx, key, "a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire: ok=%v err=%v", ok, err)
		}
		if _, ok, err := c.Acquire(ctx, key, "b", time.Minute); err != nil || ok {
			t.Fatalf("acquire of a held key: ok=%v err=%v, want denied", ok, err)
		}
		if g, err = c.Renew(ctx, g.Token, time.Minute); err != nil {
			t.Fatalf("renew: %v", err)
		}
		st, err := c.Inspect(ctx, key)
		if err != nil || !st.Held || st.Owner != "a" || st.Epoch != g.Epoch {
			t.Fatalf("inspect: %+v %v", st, err)
		}
		all, err := c.List(ctx)
		if err != nil || len(all) == 0 {
			t.Fatalf("list: %d %v", len(all), err)
		}
		if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS writes_"+mode+" (epoch bigint)"); err != nil {
			t.Fatal(err)
		}
		write := func(epoch int64) func(pgx.Tx) error {
			return func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO writes_"+mode+" VALUES ($1)", epoch)
				return err
			}
		}
		if err := fence.InTx(ctx, pool, g.Token, write(g.Epoch)); err != nil {
			t.Fatalf("fence.InTx under the current grant: %v", err)
		}

		// A blocking acquire waits on the server for the release.
		got := make(chan error, 1)
		var g2 lease.Grant
		go func() {
			var err error
			g2, err = c.AcquireWait(ctx, key, "b", time.Minute, 30*time.Second)
			got <- err
		}()
		pgtest.Eventually(t, 30*time.Second, "the blocking acquire to wait on the server", func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%lease.acquire%' AND state = 'active' AND pid <> pg_backend_pid()`).Scan(&n)
			return err == nil && n > 0
		})
		if err := c.Release(ctx, g.Token); err != nil {
			t.Fatalf("release: %v", err)
		}
		if err := <-got; err != nil || g2.Epoch <= g.Epoch {
			t.Fatalf("blocking acquire after the release: %+v %v", g2, err)
		}

		called := false
		err = fence.InTx(ctx, pool, g.Token, func(pgx.Tx) error { called = true; return nil })
		if !errors.Is(err, fence.ErrStale) && !errors.Is(err, lease.ErrLapsed) && !errors.Is(err, lease.ErrEpochMismatch) {
			t.Fatalf("fence.InTx with a stale token: %v, want refused", err)
		}
		if called {
			t.Fatal("fence.InTx ran the function of a stale token")
		}
		released, prev, _, err := leaseadmin.ForceRelease(ctx, c, key)
		if err != nil || !released || prev != "b" {
			t.Fatalf("force release: %v %q %v", released, prev, err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM writes_"+mode).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d fenced writes (err %v), want 1", n, err)
		}
	})
}

// testWaiter: listen.NewWaiter connects through each pool mode
// (it used to send lock_timeout in its startup message, which PgBouncer
// refuses). In session pooling the notifications pass: Await with a poll far
// out wakes on the release. In transaction pooling LISTEN is accepted but no
// notification reaches the waiter; Await falls back to its poll and still
// sees the release.
func testWaiter(t *testing.T, s *setup) {
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 0)
		w, err := listen.NewWaiter(ctx, connConfig(t, dsn), listen.Options{})
		if err != nil {
			t.Fatalf("NewWaiter through PgBouncer in %s pooling: %v", mode, err)
		}
		defer w.Close()
		c := lease.New(newPool(t, dsn))
		holder := s.directClient(t)
		key := "waiter-" + mode

		events := w.Watch(ctx, key)
		if _, ok, err := holder.Acquire(ctx, key, "holder", time.Hour); err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		var notified bool
		select {
		case ev := <-events:
			notified = ev.Type == listen.EventAcquired && ev.Key == key
			if !notified {
				t.Fatalf("event %+v, want the grant of %s", ev, key)
			}
		case <-time.After(notifyWait(mode)):
		}
		t.Logf("%s pooling: the grant notified: %v", mode, notified)
		if want := mode == "session"; notified != want {
			t.Fatalf("%s pooling: notification passed = %v, want %v (docs/operations.md)", mode, notified, want)
		}

		// The poll: far out where notifications pass, short where they cannot.
		poll := time.Hour
		if mode == "transaction" {
			poll = 500 * time.Millisecond
		}
		st, err := holder.Inspect(ctx, key)
		if err != nil || !st.Held {
			t.Fatal(st, err)
		}
		woke := make(chan time.Time, 1)
		go func() {
			_, err := listen.Await(ctx, w, c, key, poll, func(s lease.State) bool { return !s.Held })
			if err != nil {
				t.Errorf("await: %v", err)
			}
			woke <- time.Now()
		}()
		time.Sleep(200 * time.Millisecond) // Await has read the key held (or, broken, returns late)
		g := lease.Grant{Token: lease.Token{Key: key, Owner: "holder", Epoch: st.Epoch}}
		released := time.Now()
		if err := holder.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-woke:
			t.Logf("%s pooling: Await (poll %v) saw the release after %s", mode, poll, ms(at.Sub(released)))
		case <-time.After(time.Minute):
			t.Fatalf("%s pooling: Await (poll %v) did not see the release within a minute", mode, poll)
		}
	})
}

// notifyWait is how long a test waits for a notification: long where one
// must come; where none can, long enough that one would have come.
func notifyWait(mode string) time.Duration {
	if mode == "session" {
		return 30 * time.Second
	}
	return 3 * time.Second
}
