package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// hookEvent is one step of a waiter's goroutine (see NewWaiterWithHook).
type hookEvent struct{ kind, key string }

// recorder collects a waiter's steps so that tests wait on them.
type recorder struct {
	ch    chan hookEvent
	block func(hookEvent) // called first, may block the waiter
}

func (r *recorder) hook(kind, key string) {
	ev := hookEvent{kind, key}
	if r.block != nil {
		r.block(ev)
	}
	select {
	case r.ch <- ev:
	default: // never in these tests: the buffer is far larger than their steps
	}
}

// next waits for the next step of the given kind (and key, if not empty).
func (r *recorder) next(t testing.TB, kind, key string) {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case ev := <-r.ch:
			if ev.kind == kind && (key == "" || ev.key == key) {
				return
			}
		case <-timeout.C:
			t.Fatalf("waiter step %s %q did not come", kind, key)
		}
	}
}

func newWaiter(t testing.TB, db *testDB, opts lease.WaiterOptions) (*lease.Waiter, *recorder) {
	t.Helper()
	rec := &recorder{ch: make(chan hookEvent, 4096)}
	w, err := lease.NewWaiterWithHook(testCtx(t), db.dsn, opts, rec.hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w, rec
}

type acquired struct {
	g   lease.Grant
	err error
	at  time.Time // when Acquire returned
}

// acquireAsync runs w.Acquire in a goroutine; the result arrives on the
// returned channel.
func acquireAsync(ctx context.Context, w *lease.Waiter, key, owner string, ttl time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		g, err := w.Acquire(ctx, key, owner, ttl)
		ch <- acquired{g, err, time.Now()}
	}()
	return ch
}

func mustGrant(t *testing.T, ch <-chan acquired) lease.Grant {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("waiter Acquire: %v", r.err)
		}
		return r.g
	case <-time.After(time.Minute):
		t.Fatal("waiter Acquire did not return")
	}
	return lease.Grant{}
}

const never = time.Hour // a fallback poll or TTL that no test waits for

func TestWaiterAcquiresFreeKeyAtOnce(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		w, _ := newWaiter(t, db, lease.WaiterOptions{FallbackPoll: never})
		g, err := w.Acquire(testCtx(t), "free", "alice", time.Minute)
		if err != nil || g.Owner != "alice" || g.Epoch != 1 || g.Remaining() <= 0 {
			t.Fatalf("Acquire of a free key: %+v, %v", g, err)
		}
		if s := w.Stats(); s.Attempts != 1 {
			t.Fatalf("stats %+v, want one attempt", s)
		}
	})
}

// TestWaiterWakesOnRelease: with the fallback poll and the holder's TTL far
// out, only the notification of the release (or force_release) can hand the
// key over.
func TestWaiterWakesOnRelease(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		for _, force := range []bool{false, true} {
			t.Run(fmt.Sprintf("force=%v", force), func(t *testing.T) {
				ctx := testCtx(t)
				key := fmt.Sprintf("release/%v", force)
				h, ok, err := db.c.Acquire(ctx, key, "holder", never)
				if err != nil || !ok {
					t.Fatal(ok, err)
				}
				w, rec := newWaiter(t, db, lease.WaiterOptions{FallbackPoll: never})
				res := acquireAsync(ctx, w, key, "waiter", time.Minute)
				rec.next(t, "denied", key)
				if force {
					_, _, _, err = db.c.ForceRelease(ctx, key)
				} else {
					err = db.c.Release(ctx, h.Token)
				}
				if err != nil {
					t.Fatal(err)
				}
				g := mustGrant(t, res)
				if g.Owner != "waiter" || g.Epoch <= h.Epoch {
					t.Fatalf("grant %+v after holder %+v", g, h)
				}
				s := w.Stats()
				if s.WakesNotify != 1 || s.WakesPoll != 0 || s.WakesExpiry != 0 || s.Attempts != 2 {
					t.Fatalf("stats %+v: want exactly one denied attempt and one woken by the notification", s)
				}
			})
		}
	})
}

// TestWaiterWakesAtExpiry: a holder that stops renewing; with no fallback
// poll, the waiter wakes at the server's expiry (converted to the local
// clock) without busy-polling before it.
func TestWaiterWakesAtExpiry(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, lease.WaiterOptions{FallbackPoll: -1})
		h, ok, err := db.c.Acquire(ctx, "expiry", "holder", 300*time.Millisecond)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		res := acquireAsync(ctx, w, "expiry", "waiter", time.Minute)
		rec.next(t, "denied", "expiry")
		g := mustGrant(t, res)
		if g.Epoch != h.Epoch+1 {
			t.Fatalf("grant %+v after %+v", g, h)
		}
		s := w.Stats()
		if s.WakesExpiry < 1 || s.WakesNotify != 0 || s.WakesPoll != 0 || s.Attempts > 4 {
			t.Fatalf("stats %+v: want a wake at expiry and no busy loop", s)
		}
		all, err := db.c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range all {
			if st.Key == "expiry" {
				t.Logf("server: granted %v after the previous grant's expiry (%d attempts)",
					st.AcquiredAt.Sub(h.ExpiresAt), s.Attempts)
			}
		}
	})
}

// TestWaiterFallbackPoll: the releaser sends no notification
// (pg_lease.notify = off) and the TTL is far out: only the fallback poll
// hands the key over.
func TestWaiterFallbackPoll(t *testing.T) {
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
		w, rec := newWaiter(t, db, lease.WaiterOptions{FallbackPoll: 20 * time.Millisecond})
		res := acquireAsync(ctx, w, "poll", "waiter", time.Minute)
		rec.next(t, "denied", "poll")
		if err := rc.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		mustGrant(t, res)
		if s := w.Stats(); s.WakesPoll < 1 || s.WakesNotify != 0 {
			t.Fatalf("stats %+v: want the grant through the poll, no release notification", s)
		}
	})
}

// TestWaiterSurvivesTerminatedConnection: the listen connection is
// terminated; the waiter reconnects, listens again, and still wakes on a
// release, both one made after the reconnect (notification) and one made
// while no connection listened (the re-check after reconnecting).
func TestWaiterSurvivesTerminatedConnection(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		var (
			mu      sync.Mutex
			onLost  func()
			lostOne = make(chan struct{}, 1)
		)
		rec := &recorder{ch: make(chan hookEvent, 4096), block: func(ev hookEvent) {
			if ev.kind != "conn_lost" {
				return
			}
			mu.Lock()
			f := onLost
			mu.Unlock()
			if f != nil {
				f() // runs on the waiter's goroutine, while it has no connection
			}
			lostOne <- struct{}{}
		}}
		w, err := lease.NewWaiterWithHook(ctx, db.dsn, lease.WaiterOptions{FallbackPoll: never, ReconnectMin: time.Millisecond}, rec.hook)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		rec.next(t, "listening", "")
		terminate := func() {
			t.Helper()
			var n int
			if err := db.pool.QueryRow(ctx,
				`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				  WHERE application_name = 'pg_lease waiter' AND datname = current_database()`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("terminating the waiter's backend: %d %v", n, err)
			}
		}

		t.Run("release after reconnect", func(t *testing.T) {
			h, ok, err := db.c.Acquire(ctx, "a", "holder", never)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			res := acquireAsync(ctx, w, "a", "waiter", time.Minute)
			rec.next(t, "denied", "a")
			terminate()
			<-lostOne
			rec.next(t, "listening", "")
			rec.next(t, "denied", "a") // the re-check after reconnecting
			if err := db.c.Release(ctx, h.Token); err != nil {
				t.Fatal(err)
			}
			mustGrant(t, res)
			if s := w.Stats(); s.WakesNotify != 1 || s.ConnLost != 1 || s.Connects != 2 {
				t.Fatalf("stats %+v", s)
			}
		})

		t.Run("release while disconnected", func(t *testing.T) {
			h, ok, err := db.c.Acquire(ctx, "b", "holder", never)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			res := acquireAsync(ctx, w, "b", "waiter", time.Minute)
			rec.next(t, "denied", "b")
			released := make(chan error, 1)
			mu.Lock()
			onLost = func() { released <- db.c.Release(ctx, h.Token) }
			mu.Unlock()
			terminate()
			<-lostOne
			if err := <-released; err != nil {
				t.Fatal(err)
			}
			before := w.Stats()
			mustGrant(t, res)
			if s := w.Stats(); s.WakesNotify != before.WakesNotify || s.ConnLost != 2 || s.Connects != 3 {
				t.Fatalf("stats %+v: want the grant from the re-check after reconnecting", s)
			}
		})
	})
}

// TestWaiterManyGoroutines: several goroutines wait for one key on one
// waiter; each winner releases; every one gets it once, under increasing
// epochs.
func TestWaiterManyGoroutines(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, _ := newWaiter(t, db, lease.WaiterOptions{FallbackPoll: never})
		h, ok, err := db.c.Acquire(ctx, "many", "holder", never)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		const n = 6
		grants := make(chan lease.Grant, n)
		errs := make(chan error, n)
		for i := range n {
			go func() {
				g, err := w.Acquire(ctx, "many", fmt.Sprintf("w%d", i), time.Minute)
				if err != nil {
					errs <- err
					return
				}
				grants <- g
				errs <- db.c.Release(ctx, g.Token)
			}()
		}
		if err := db.c.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		last := h.Epoch
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		close(grants)
		var epochs []int64
		for g := range grants {
			if seen[g.Owner] {
				t.Fatalf("%s granted twice", g.Owner)
			}
			seen[g.Owner] = true
			epochs = append(epochs, g.Epoch)
		}
		if len(seen) != n {
			t.Fatalf("%d of %d waiters got the key", len(seen), n)
		}
		for _, e := range epochs {
			if e <= last {
				t.Fatalf("epochs %v not increasing after %d", epochs, h.Epoch)
			}
			last = e
		}
	})
}

// TestWaiterCancel: a waiting Acquire whose context ends returns its error
// and leaves nothing held.
func TestWaiterCancel(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, lease.WaiterOptions{FallbackPoll: never})
		h, ok, err := db.c.Acquire(ctx, "cancel", "holder", never)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		wctx, cancel := context.WithCancel(ctx)
		res := acquireAsync(wctx, w, "cancel", "waiter", time.Minute)
		rec.next(t, "denied", "cancel")
		cancel()
		if r := <-res; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled Acquire: %+v", r)
		}
		// The waiter no longer competes: a release leaves the key free.
		if err := db.c.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		// A second waiter on the same Waiter proves the loop went past the
		// release notification.
		if _, err := w.Acquire(ctx, "other", "x", time.Minute); err != nil {
			t.Fatal(err)
		}
		if st, err := db.c.Inspect(ctx, "cancel"); err != nil || st.Held {
			t.Fatalf("after the cancelled wait: %+v %v", st, err)
		}
	})
}

// TestWaiterErrors: server errors end the wait; Close ends every wait and
// every Watch.
func TestWaiterErrors(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, lease.WaiterOptions{})
		if _, err := w.Acquire(ctx, "", "a", time.Minute); !errors.Is(err, lease.ErrInvalidInput) {
			t.Fatalf("empty key: %v", err)
		}
		if _, err := w.Acquire(ctx, "k", "a", 0); !errors.Is(err, lease.ErrInvalidInput) {
			t.Fatalf("zero ttl: %v", err)
		}
		if _, ok, err := db.c.Acquire(ctx, "held", "holder", never); err != nil || !ok {
			t.Fatal(ok, err)
		}
		res := acquireAsync(ctx, w, "held", "waiter", time.Minute)
		events := w.Watch(ctx)
		rec.next(t, "denied", "held")
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if r := <-res; !errors.Is(r.err, lease.ErrWaiterClosed) {
			t.Fatalf("Acquire across Close: %+v", r)
		}
		for range events {
		}
		if _, err := w.Acquire(ctx, "k", "a", time.Minute); !errors.Is(err, lease.ErrWaiterClosed) {
			t.Fatalf("Acquire after Close: %v", err)
		}
		if _, ok := <-w.Watch(ctx); ok {
			t.Fatal("Watch after Close delivered an event")
		}
	})
}

func TestWaiterNotInstalled(t *testing.T) {
	db := &testDB{dsn: pgtest.NewDatabase(t)}
	w, _ := newWaiter(t, db, lease.WaiterOptions{})
	if _, err := w.Acquire(testCtx(t), "k", "a", time.Minute); !errors.Is(err, lease.ErrNotInstalled) {
		t.Fatalf("Acquire: %v, want ErrNotInstalled", err)
	}
}

func TestWaiterOptions(t *testing.T) {
	for _, o := range []lease.WaiterOptions{
		{ClockRefresh: -1}, {ReconnectMin: -1}, {ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
		{QueryTimeout: -1}, {WatchBuffer: -1},
	} {
		if _, err := lease.NewWaiter(context.Background(), "postgres://invalid.invalid/x", o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if _, err := lease.NewWaiter(context.Background(), "::not a dsn", lease.WaiterOptions{}); err == nil {
		t.Error("bad DSN accepted")
	}
}

// TestWatch: a subscription sees every change of its keys in commit order,
// and a resync after the listen connection was re-established.
func TestWatch(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, lease.WaiterOptions{ReconnectMin: time.Millisecond})
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
		if _, _, _, err := db.c.ForceRelease(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		want := []lease.Event{
			{Type: lease.EventAcquired, Key: "a", Owner: "alice", Epoch: 1},
			{Type: lease.EventAcquired, Key: "b", Owner: "bob", Epoch: 1},
			{Type: lease.EventReleased, Key: "a", Owner: "alice", Epoch: 1},
			{Type: lease.EventForceReleased, Key: "b", Owner: "bob", Epoch: 1},
		}
		expect := func(ch <-chan lease.Event, want []lease.Event) {
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
		expect(onlyA, []lease.Event{want[0], want[2]})
		cancel()
		for range onlyA { // closed when its context ends
		}

		var n int
		if err := db.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'pg_lease waiter' AND datname = current_database()`).Scan(&n); err != nil || n != 1 {
			t.Fatal(n, err)
		}
		rec.next(t, "conn_lost", "")
		if ev := <-all; ev.Type != lease.EventResync {
			t.Fatalf("after reconnecting: %+v, want resync", ev)
		}
	})
}
