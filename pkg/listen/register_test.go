package listen_test

// Registrations with lease.listen, and reads shared between Awaits.

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/listen"
)

// registrations counts the waiter backends' lease.listen registrations of
// key in db (lease.listeners is owner-only: the test role is a superuser).
func registrations(t *testing.T, db *testDB, key string) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(testCtx(t), `SELECT count(*) FROM lease.listeners l
		  JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.application_name = 'pg_lease waiter' AND a.datname = current_database()
		   AND l.key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// nextFor waits for the next step of the given kind and detail.
func (r *recorder) nextFor(t testing.TB, kind listen.Signal, detail string) {
	t.Helper()
	r.await(t, kind.String()+" "+strconv.Quote(detail), func(ev hookEvent) bool { return ev.kind == kind && ev.detail == detail })
}

// sawNotified drains what the waiter's hook recorded so far and reports
// whether a notification for key was among it.
func (r *recorder) sawNotified(key string) bool {
	for {
		select {
		case ev := <-r.ch:
			if ev.kind == listen.Notified && ev.detail == key {
				return true
			}
		default:
			return false
		}
	}
}

// TestAwaitRegisters: with the default pg_lease.notify
// (waiters), a change notifies only keys some backend registered with
// lease.listen. Await registers its key on the waiter's connection before
// its first read, is woken by the release's notification (the poll and the
// TTL are far out; the hook shows the notification arrived), drops the
// registration when it returns, and registers again after the listen
// connection is re-established. Watch without keys registers '*'.
func TestAwaitRegisters(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{ReconnectMin: time.Millisecond})
		rec.next(t, listen.Listening)
		round := func(key string) {
			t.Helper()
			h, ok, err := db.c.Acquire(ctx, key, "holder", never)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			c, reads := watched(db)
			res := awaitAsync(ctx, w, c, key, never)
			<-reads // registered before this read
			if n := registrations(t, db, key); n != 1 {
				t.Fatalf("%d registrations of %q while Await waits, want 1", n, key)
			}
			rec.sawNotified(key) // drop what came before the release
			if err := db.c.Release(ctx, h.Token); err != nil {
				t.Fatal(err)
			}
			mustFree(t, res)
			if !rec.sawNotified(key) {
				t.Fatalf("Await on %q returned without the release's notification", key)
			}
			rec.nextFor(t, listen.Unlisten, key) // after registrationLinger
			if n := registrations(t, db, key); n != 0 {
				t.Fatalf("%d registrations of %q after Await returned, want 0", n, key)
			}
		}
		round("reg")
		// grantSeen: regKey has one registration; a grant of key then comes
		// on events.
		grantSeen := func(events <-chan listen.Event, regKey, key, when string) {
			t.Helper()
			if n := registrations(t, db, regKey); n != 1 {
				t.Fatalf("%d registrations of %q %s, want 1", n, regKey, when)
			}
			if _, _, err := db.c.Acquire(ctx, key, "holder", never); err != nil {
				t.Fatal(err)
			}
			if ev := <-events; ev.Type != "acquired" || ev.Key != key {
				t.Fatalf("%s: %+v, want the grant of %s", when, ev, key)
			}
		}

		// Reconnect: a subscription that outlives its connection is
		// registered again on the new one before the resync.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events := w.Watch(wctx, "again")
		if n := registrations(t, db, "again"); n != 1 {
			t.Fatalf("%d registrations after Watch returned, want 1", n)
		}
		var old []int32
		if err := db.pool.QueryRow(ctx, `SELECT array_agg(pid) FROM pg_stat_activity
			WHERE application_name = 'pg_lease waiter' AND datname = current_database()`).Scan(&old); err != nil || len(old) != 1 {
			t.Fatal(old, err)
		}
		if _, err := db.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, old[0]); err != nil {
			t.Fatal(err)
		}
		if ev := <-events; ev.Type != "resync" {
			t.Fatalf("after reconnecting: %+v, want resync", ev)
		}
		// pg_terminate_backend only signals: the old backend (and its
		// registration, counted while it is still in pg_stat_activity) may
		// outlive the reconnection by a moment. Count once it is gone.
		for gone := false; !gone; {
			if err := db.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, old[0]).Scan(&gone); err != nil {
				t.Fatal(err)
			}
			if !gone {
				time.Sleep(5 * time.Millisecond)
			}
		}
		grantSeen(events, "again", "again", "after the reconnection's resync")
		cancel()
		round("reg2")

		all := w.Watch(ctx)
		grantSeen(all, "*", "any", "after Watch()")

		// Close drops the registrations (a gone backend's would linger,
		// notifying, until the next lease.listen by anyone).
		_ = w.Close()
		var left int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM lease.listeners`).Scan(&left); err != nil || left != 0 {
			t.Fatalf("%d registrations after Close, want 0 (%v)", left, err)
		}
	})
}

// TestAwaitRegistersBeforeReading: the key's registration is committed
// before Await's first read (else a release in between, deciding not to
// notify, would be missed): when the waiter's goroutine reports the listen,
// no read has happened yet.
func TestAwaitRegistersBeforeReading(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		c, reads := watched(db)
		readsAtListen := make(chan int, 1)
		rec := &recorder{ch: make(chan hookEvent, 4096), block: func(ev hookEvent) {
			if ev.kind == listen.Listen && ev.detail == "order" {
				readsAtListen <- len(reads)
			}
		}}
		w, err := listen.NewWaiterWithHook(ctx, connConfig(t, db.dsn), listen.Options{}, rec.hook)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if _, _, err := db.c.Acquire(ctx, "order", "holder", never); err != nil {
			t.Fatal(err)
		}
		res := awaitAsync(ctx, w, c, "order", never)
		if n := <-readsAtListen; n != 0 {
			t.Fatalf("%d reads before the key was registered, want 0", n)
		}
		<-reads
		if _, _, _, err := leaseadmin.ForceRelease(ctx, db.c, "order"); err != nil {
			t.Fatal(err)
		}
		mustFree(t, res)
	})
}

// gatedReads is a Querier whose lease.inspect calls wait for the gate (when
// one is set) before they run.
type gatedReads struct {
	lease.Querier
	mu   sync.Mutex
	gate chan struct{}
}

func (q *gatedReads) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	q.mu.Lock()
	g := q.gate
	q.mu.Unlock()
	if g != nil && strings.Contains(sql, "lease.inspect") {
		<-g
	}
	return q.Querier.QueryRow(ctx, sql, args...)
}

// TestAwaitSharesReads (no herd of queries): Awaits of one
// key through one client and one Waiter, woken by the same notification,
// share one read: while the first one's read is held at the gate, every
// other one joins it.
func TestAwaitSharesReads(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{})
		gq := &gatedReads{Querier: db.pool}
		counted := make(chan struct{}, 64)
		c := lease.New(readSignal{gq, counted}) // every Await through the same client
		// The Awaits want the next holder's expiry, which a notification of
		// the grant does not carry: each wake-up needs a read.
		next := func(s lease.State) bool { return s.Held && s.Owner == "next" && !s.ExpiresAt.IsZero() }
		const n = 8
		res := make(chan awaited, n)
		for i := 0; i < n; i++ {
			go func() {
				st, err := listen.Await(ctx, w, c, "herd", never, next)
				res <- awaited{st, err}
			}()
		}
		for i := 0; i < n; i++ {
			<-counted // every first read (each Await's own) saw the key never leased
		}
		gate := make(chan struct{})
		gq.mu.Lock()
		gq.gate = gate
		gq.mu.Unlock()
		if _, ok, err := db.c.Acquire(ctx, "herd", "next", never); err != nil || !ok {
			t.Fatal(ok, err)
		}
		for i := 0; i < n-1; i++ {
			rec.next(t, listen.ReadShared)
		}
		close(gate)
		for i := 0; i < n; i++ {
			if r := <-res; r.err != nil || !next(r.st) {
				t.Fatalf("Await: %+v, %v", r.st, r.err)
			}
		}
		if extra := len(counted); extra != 1 {
			t.Fatalf("%d reads after the grant for %d Awaits, want 1 shared", extra, n)
		}
	})
}

// TestWatchBesideAnOpenCleanup: another role calls lease.listen, whose
// clean-up deletes registrations of backends that are gone, and keeps its
// transaction open with those rows locked. The waiter's own listen skips
// them: Watch registers without hitting its lock_timeout (no
// listen_locked), and the key's change is notified.
func TestWatchBesideAnOpenCleanup(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		// Registrations of two backends that are gone (pids no backend has).
		if _, err := db.pool.Exec(ctx, `INSERT INTO lease.listeners (pid, key, since)
			SELECT g.p, 'gone-' || i, clock_timestamp() FROM (VALUES (-1), (-2)) g(p), generate_series(1, 60) i`); err != nil {
			t.Fatal(err)
		}
		_, eveDSN := pgtest.NewRole(t, db.dsn, "regress_pglease_eve")
		eve := connect(t, eveDSN)
		if _, err := eve.Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
		if _, err := eve.Exec(ctx, `SELECT lease.listen('eve')`); err != nil {
			t.Fatal(err)
		}
		var locked int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM lease.listeners WHERE pid < 0
			AND ctid NOT IN (SELECT ctid FROM lease.listeners WHERE pid < 0 FOR UPDATE SKIP LOCKED)`).Scan(&locked); err != nil {
			t.Fatal(err)
		}
		if locked == 0 {
			t.Fatal("eve's listen locked no registration of the gone backends")
		}
		w, rec := newWaiter(t, db, listen.Options{})
		rec.next(t, listen.Listening)
		watched := make(chan (<-chan listen.Event), 1)
		go func() { watched <- w.Watch(ctx, "k") }()
		rec.await(t, `listen "k"`, func(ev hookEvent) bool {
			if ev.kind == listen.ListenLocked {
				t.Fatalf("the waiter's listen of %s waited for eve's locks (listen_locked)", ev.detail)
			}
			return ev.kind == listen.Listen && ev.detail == "k"
		})
		events := <-watched
		if _, _, err := db.c.Acquire(ctx, "k", "holder", time.Minute); err != nil {
			t.Fatal(err)
		}
		for ev := range events {
			if ev.Type == "acquired" && ev.Key == "k" {
				break
			}
		}
		if _, err := eve.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWatchBehindALockedRow: lease.listen waits behind a transaction that
// keeps the key's row locked; the waiter bounds that wait (lock_timeout),
// keeps delivering other keys' notifications meanwhile, and registers the
// key once the transaction ends.
func TestWatchBehindALockedRow(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{})
		rec.next(t, listen.Listening)
		other := w.Watch(ctx, "other")
		if _, _, err := db.c.Acquire(ctx, "locked", "holder", never); err != nil {
			t.Fatal(err)
		}
		locker := connect(t, db.dsn)
		if _, err := locker.Exec(ctx, `BEGIN; SELECT FROM lease.leases WHERE key = 'locked' FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		watched := make(chan (<-chan listen.Event), 1)
		go func() { watched <- w.Watch(ctx, "locked") }()
		rec.next(t, listen.ListenLocked)
		if _, _, err := db.c.Acquire(ctx, "other", "holder", never); err != nil {
			t.Fatal(err)
		}
		if ev := <-other; ev.Type != "acquired" || ev.Key != "other" {
			t.Fatalf("while listen waits: %+v, want the grant of other", ev)
		}
		if _, err := locker.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
		locked := <-watched
		if n := registrations(t, db, "locked"); n != 1 {
			t.Fatalf("%d registrations of locked after Watch returned, want 1", n)
		}
		if _, _, _, err := leaseadmin.ForceRelease(ctx, db.c, "locked"); err != nil {
			t.Fatal(err)
		}
		for ev := range locked {
			if ev.Type == "force_released" {
				break
			}
		}
	})
}
