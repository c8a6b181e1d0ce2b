package listen_test

import (
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// A Waiter built with ConnectInBackground while the server is down starts
// at once, connects when the server is back, tells its subscribers to read
// again, and then delivers notifications.
func TestWaiterConnectsInBackground(t *testing.T) {
	ctx := testCtx(t)
	srv := pgtest.New(t)
	dsn := pgtest.NewLeaseDatabaseOn(t, srv)
	// One server without standbys, as its operator would configure it: the
	// first grant after the restart below is made at once (in the default
	// mode 'any', a restart starts a grace of max_ttl).
	if _, err := pgtest.Connect(t, dsn).Exec(ctx, "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := listen.NewWaiter(ctx, connConfig(t, dsn), listen.Options{}); err == nil {
		t.Fatal("NewWaiter without ConnectInBackground succeeded while the server was down")
	}
	rec := &recorder{ch: make(chan hookEvent, 4096)}
	w, err := listen.NewWaiterWithHook(ctx, connConfig(t, dsn),
		listen.Options{ConnectInBackground: true, ReconnectMax: 200 * time.Millisecond}, rec.hook)
	if err != nil {
		t.Fatalf("NewWaiter with ConnectInBackground while the server is down: %v", err)
	}
	defer w.Close()
	rec.next(t, listen.ConnectFailed)
	events := w.Watch(ctx, "k") // returns at once: nothing listens yet

	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rec.next(t, listen.Listening) // k is registered by now
	next := func() listen.Event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return listen.Event{}
	}
	if ev := next(); ev.Type != listen.EventResync {
		t.Fatalf("first event %+v, want a resync", ev)
	}
	c := lease.New(newPool(t, dsn))
	if _, ok, err := c.Acquire(ctx, "k", "a", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if ev := next(); ev.Type != listen.EventAcquired || ev.Key != "k" || ev.Owner != "a" {
		t.Fatalf("event %+v, want k acquired by a", ev)
	}
}

// A Waiter whose reconnection backoff has grown long connects again as
// soon as a read through Await reaches the server, not at the end of the
// backoff: after a failover, a release is then notified at once.
func TestWaiterReconnectsWhenAReadReachesTheServer(t *testing.T) {
	ctx := testCtx(t)
	srv := pgtest.New(t)
	dsn := pgtest.NewLeaseDatabaseOn(t, srv)
	rec := &recorder{ch: make(chan hookEvent, 4096)}
	// A backoff of an hour: only a read can bring the connection back in time.
	w, err := listen.NewWaiterWithHook(ctx, connConfig(t, dsn),
		listen.Options{ReconnectMin: never, ReconnectMax: never}, rec.hook)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rec.next(t, listen.Listening)
	holder := lease.New(newPool(t, dsn))
	g, ok, err := holder.Acquire(ctx, "k", "holder", never)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	rec.next(t, listen.ConnectFailed) // now in its backoff
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := lease.New(newPool(t, dsn))
	res := awaitAsync(ctx, w, c, "k", never)
	rec.next(t, listen.Listening)
	// The holder's pool lost its connections with the server.
	if err := lease.New(newPool(t, dsn)).Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	mustFree(t, res)
}
