package listen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/listen"
)

// hookEvent is one step of a waiter's goroutine (see NewWaiterWithHook).
type hookEvent struct {
	kind   listen.Signal
	detail string
}

// recorder collects a waiter's steps so that tests wait on them.
type recorder struct {
	ch    chan hookEvent
	block func(hookEvent) // called first, may block the waiter
}

func (r *recorder) hook(kind listen.Signal, detail string) {
	ev := hookEvent{kind, detail}
	if r.block != nil {
		r.block(ev)
	}
	select {
	case r.ch <- ev:
	default: // never in these tests: the buffer is far larger than their steps
	}
}

// next waits for the next step of the given kind.
func (r *recorder) next(t testing.TB, kind listen.Signal) {
	t.Helper()
	r.await(t, kind.String(), func(ev hookEvent) bool { return ev.kind == kind })
}

// await reads steps until one matches; it fails the test ("waiter step
// <what> did not come") when none has within a minute.
func (r *recorder) await(t testing.TB, what string, match func(hookEvent) bool) {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case ev := <-r.ch:
			if match(ev) {
				return
			}
		case <-timeout.C:
			t.Fatalf("waiter step %s did not come", what)
		}
	}
}

func newWaiter(t testing.TB, db *testDB, opts listen.Options) (*listen.Waiter, *recorder) {
	t.Helper()
	rec := &recorder{ch: make(chan hookEvent, 4096)}
	w, err := listen.NewWaiterWithHook(testCtx(t), connConfig(t, db.dsn), opts, rec.hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w, rec
}

// readSignal is a Querier that signals each completed lease.inspect, so
// that a test can act after Await's first read without sleeping.
type readSignal struct {
	lease.Querier
	reads chan struct{}
}

type signalRow struct {
	pgx.Row
	reads chan struct{}
}

func (r signalRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.reads <- struct{}{}
	return err
}

func (q readSignal) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := q.Querier.QueryRow(ctx, sql, args...)
	if strings.Contains(sql, "lease.inspect") {
		return signalRow{row, q.reads}
	}
	return row
}

func watched(db *testDB) (*lease.Client, chan struct{}) {
	reads := make(chan struct{}, 64)
	return lease.New(readSignal{db.pool, reads}), reads
}

type awaited struct {
	st  lease.State
	err error
}

func awaitAsync(ctx context.Context, w *listen.Waiter, c *lease.Client, key string, poll time.Duration) <-chan awaited {
	ch := make(chan awaited, 1)
	go func() {
		st, err := listen.Await(ctx, w, c, key, poll, func(s lease.State) bool { return !s.Held })
		ch <- awaited{st, err}
	}()
	return ch
}

func mustFree(t *testing.T, ch <-chan awaited) lease.State {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil || r.st.Held {
			t.Fatalf("Await: %+v, %v", r.st, r.err)
		}
		return r.st
	case <-time.After(time.Minute):
		t.Fatal("Await did not return")
	}
	return lease.State{}
}

// TestAwaitReturnsAtOnce: a key already in the state asked for costs one
// read and no wait.
func TestAwaitReturnsAtOnce(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		w, _ := newWaiter(t, db, listen.Options{})
		c, reads := watched(db)
		st := mustFree(t, awaitAsync(testCtx(t), w, c, "free", never))
		if st.Exists || len(reads) != 1 {
			t.Fatalf("state %+v after %d reads, want one read of a never-leased key", st, len(reads))
		}
	})
}

// TestAwaitWakesOnNotification: with the poll and the holder's TTL far out,
// only the notification of the release (or force_release), sent after
// Await's first read, can wake it.
func TestAwaitWakesOnNotification(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, _ := newWaiter(t, db, listen.Options{})
		for _, force := range []bool{false, true} {
			h, ok, err := db.c.Acquire(ctx, "rel", "holder", never)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			c, reads := watched(db)
			res := awaitAsync(ctx, w, c, "rel", never)
			<-reads // the first read saw the key held
			if force {
				_, _, _, err = leaseadmin.ForceRelease(ctx, db.c, "rel")
			} else {
				err = db.c.Release(ctx, h.Token)
			}
			if err != nil {
				t.Fatal(err)
			}
			if st := mustFree(t, res); st.Epoch <= h.Epoch-1 {
				t.Fatalf("state %+v after releasing %+v", st, h)
			}
		}
	})
}

// TestAwaitReadsAfterANotification: a release, a force-release and a
// handover wake the Await, which reads the key and returns the state read
// (with the server's clock), not the one the notification names.
func TestAwaitReadsAfterANotification(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, _ := newWaiter(t, db, listen.Options{})
		for _, how := range []string{"release", "force_release", "handover"} {
			key := "notified-" + how
			h, ok, err := db.c.Acquire(ctx, key, "holder", never)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			done := func(s lease.State) bool { return !s.Held }
			if how == "handover" {
				if _, err := handover.SetStrategy(ctx, db.c, key, handover.StrategyPriority); err != nil {
					t.Fatal(err)
				}
				if _, err := handover.Register(ctx, db.c, key, handover.Candidate{Owner: "next", Ready: true, TTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
				done = func(s lease.State) bool { return s.Held && s.Owner == "next" }
			}
			c, reads := watched(db)
			res := make(chan awaited, 1)
			go func() {
				st, err := listen.Await(ctx, w, c, key, never, done)
				res <- awaited{st, err}
			}()
			<-reads // the first read saw the key held
			switch how {
			case "force_release":
				_, _, _, err = leaseadmin.ForceRelease(ctx, db.c, key)
			default:
				err = db.c.Release(ctx, h.Token)
			}
			if err != nil {
				t.Fatal(err)
			}
			var got lease.State
			select {
			case r := <-res:
				if r.err != nil {
					t.Fatal(r.err)
				}
				got = r.st
			case <-time.After(time.Minute):
				t.Fatalf("%s: Await did not return", how)
			}
			if n := len(reads); n < 1 {
				t.Fatalf("%s: %d reads after the notification, want the state read", how, n)
			}
			read, err := db.c.Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if got.Key != key || got.Exists != read.Exists || got.Held != read.Held || got.Owner != read.Owner || got.Epoch != read.Epoch {
				t.Fatalf("%s: Await returned %+v, a read says %+v", how, got, read)
			}
			if got.ServerNow.IsZero() {
				t.Fatalf("%s: Await returned a state that no read returned: %+v", how, got)
			}
		}
	})
}

// TestAwaitIgnoresForgedNotifications: any role may NOTIFY pg_lease. A
// role with no grant sends a release of a held key and a handover of it to
// the waiting owner: the Await reads the key, finds it held as before, and
// waits on; the real release that follows ends it with the state read.
func TestAwaitIgnoresForgedNotifications(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	admin := connect(t, db.dsn)
	forger := fmt.Sprintf("listen_forger_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, `CREATE ROLE `+forger+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+forger) })
	fc := connect(t, pgtest.WithUser(db.dsn, forger))

	w, rec := newWaiter(t, db, listen.Options{})
	h, ok, err := db.c.Acquire(ctx, "forged", "holder", never)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	c, reads := watched(db)
	res := make(chan awaited, 1)
	go func() {
		// Free, or handed to "follower": what the forged payloads claim.
		st, err := listen.Await(ctx, w, c, "forged", never, func(s lease.State) bool { return !s.Held || s.Owner == "follower" })
		res <- awaited{st, err}
	}()
	<-reads // the first read saw the key held
	for _, payload := range []string{
		`{"event":"released","key":"forged","owner":"holder","epoch":41}`,
		`{"event":"handover","key":"forged","owner":"follower","epoch":42}`,
	} {
		if _, err := fc.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
			t.Fatal(err)
		}
		rec.await(t, "notified forged", func(ev hookEvent) bool { return ev.kind == listen.Notified && ev.detail == "forged" })
	}
	if err := db.c.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.err != nil || r.st.Held || r.st.Epoch != h.Epoch+1 || !r.st.Released || r.st.ServerNow.IsZero() {
			t.Fatalf("Await: %+v %v, want the released state read after the real release (epoch %d)", r.st, r.err, h.Epoch+1)
		}
	case <-time.After(time.Minute):
		t.Fatal("Await did not return after the real release")
	}
}

// TestAwaitWakesAtExpiry: a holder that stops renewing sends nothing; with
// the poll far out, Await wakes at the grant's expiry on the local clock
// (State.ExpiresLocal) and sees the lapse, in a handful of reads.
func TestAwaitWakesAtExpiry(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, _ := newWaiter(t, db, listen.Options{})
		h, ok, err := db.c.Acquire(ctx, "expiry", "holder", 300*time.Millisecond)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		c, reads := watched(db)
		st := mustFree(t, awaitAsync(ctx, w, c, "expiry", never))
		if st.Epoch != h.Epoch || len(reads) > 4 {
			t.Fatalf("state %+v after %d reads: want the lapse of %+v, no busy loop", st, len(reads), h)
		}
	})
}

// TestAwaitPoll: the releaser sends no notification (pg_lease.notify = off)
// and the TTL is far out: only the poll sees the release.
func TestAwaitPoll(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		releaser := connect(t, db.dsn)
		if _, err := releaser.Exec(ctx, `SET pg_lease.notify = off`); err != nil {
			t.Fatal(err)
		}
		rc := lease.New(releaser)
		h, ok, err := rc.Acquire(ctx, "poll", "holder", never)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		w, _ := newWaiter(t, db, listen.Options{})
		c, reads := watched(db)
		res := awaitAsync(ctx, w, c, "poll", 20*time.Millisecond)
		<-reads
		if err := rc.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		mustFree(t, res)
	})
}

// TestAwaitSurvivesTerminatedConnection: the listen connection is
// terminated and the key released while no connection listens; the waiter
// reconnects and its resync wakes Await (the poll is far out), and a release
// after the reconnection wakes it by notification.
func TestAwaitSurvivesTerminatedConnection(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		var (
			mu     sync.Mutex
			onLost func()
		)
		rec := &recorder{ch: make(chan hookEvent, 4096), block: func(ev hookEvent) {
			if ev.kind != listen.ConnLost {
				return
			}
			mu.Lock()
			f := onLost
			mu.Unlock()
			if f != nil {
				f() // runs on the waiter's goroutine, while it has no connection
			}
		}}
		w, err := listen.NewWaiterWithHook(ctx, connConfig(t, db.dsn), listen.Options{ReconnectMin: time.Millisecond}, rec.hook)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		rec.next(t, listen.Listening)
		terminate := func() {
			t.Helper()
			var n int
			if err := db.pool.QueryRow(ctx,
				`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				  WHERE application_name = 'pg_lease waiter' AND datname = current_database()`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("terminating the waiter's backend: %d %v", n, err)
			}
		}

		h, ok, err := db.c.Acquire(ctx, "b", "holder", never)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		c, reads := watched(db)
		res := awaitAsync(ctx, w, c, "b", never)
		<-reads
		released := make(chan error, 1)
		mu.Lock()
		onLost = func() { released <- db.c.Release(ctx, h.Token) }
		mu.Unlock()
		terminate()
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		mustFree(t, res)
		rec.next(t, listen.Listening)
		mu.Lock()
		onLost = nil
		mu.Unlock()

		h, ok, err = db.c.Acquire(ctx, "b", "holder", never)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		c, reads = watched(db)
		res = awaitAsync(ctx, w, c, "b", never)
		<-reads
		if err := db.c.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		mustFree(t, res)
	})
}

// TestAwaitCancel: Await returns its context's cause at once, and a closed
// Waiter leaves it polling.
func TestAwaitCancel(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, _ := newWaiter(t, db, listen.Options{})
		if _, ok, err := db.c.Acquire(ctx, "c", "holder", never); err != nil || !ok {
			t.Fatal(ok, err)
		}
		c, reads := watched(db)
		cctx, cancel := context.WithCancelCause(ctx)
		res := awaitAsync(cctx, w, c, "c", never)
		<-reads
		stop := errors.New("stop")
		cancel(stop)
		if r := <-res; !errors.Is(r.err, stop) {
			t.Fatalf("Await after cancel: %+v, %v", r.st, r.err)
		}
		if _, err := listen.Await(ctx, w, c, "c", 0, func(lease.State) bool { return true }); !errors.Is(err, lease.ErrInvalidInput) {
			t.Fatalf("poll 0: %v", err)
		}

		res = awaitAsync(ctx, w, c, "c", 10*time.Millisecond)
		<-reads
		_ = w.Close()
		<-reads // still reading: polling
		if _, _, _, err := leaseadmin.ForceRelease(ctx, db.c, "c"); err != nil {
			t.Fatal(err)
		}
		mustFree(t, res)
	})
}

func TestWaiterOptions(t *testing.T) {
	for _, o := range []listen.Options{
		{ReconnectMin: -1}, {ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
		{QueryTimeout: -1}, {WatchBuffer: -1},
	} {
		if _, err := listen.NewWaiter(context.Background(), connConfig(t, "postgres://invalid.invalid/x"), o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if _, err := listen.NewWaiter(context.Background(), nil, listen.Options{}); err == nil {
		t.Error("nil config accepted")
	}
}

// TestWatch: a subscription sees every change of its keys in commit order,
// and a resync after the listen connection was re-established.
func TestWatch(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{ReconnectMin: time.Millisecond})
		all := w.Watch(ctx)
		wctx, cancel := context.WithCancel(ctx)
		onlyA := w.Watch(wctx, "a")

		g, _, err := db.c.Acquire(ctx, "a", "alice", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.c.Acquire(ctx, "b", "bob", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := db.c.Renew(ctx, g.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := db.c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := leaseadmin.ForceRelease(ctx, db.c, "b"); err != nil {
			t.Fatal(err)
		}
		want := []listen.Event{
			{Type: "acquired", Key: "a", Owner: "alice", Epoch: 1},
			{Type: "acquired", Key: "b", Owner: "bob", Epoch: 1},
			{Type: "released", Key: "a", Owner: "alice", Epoch: 1},
			{Type: "force_released", Key: "b", Owner: "bob", Epoch: 1},
		}
		expect := func(ch <-chan listen.Event, want []listen.Event) {
			t.Helper()
			for _, e := range want {
				got := <-ch
				got.Received = time.Time{}
				if got != e {
					t.Fatalf("event %+v, want %+v", got, e)
				}
			}
		}
		expect(all, want)
		expect(onlyA, []listen.Event{want[0], want[2]})
		cancel()
		for range onlyA { // closed when its context ends
		}

		var n int
		if err := db.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'pg_lease waiter' AND datname = current_database()`).Scan(&n); err != nil || n != 1 {
			t.Fatal(n, err)
		}
		rec.next(t, listen.ConnLost)
		if ev := <-all; ev.Type != "resync" {
			t.Fatalf("after reconnecting: %+v, want resync", ev)
		}
	})
}
