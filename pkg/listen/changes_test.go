package listen_test

// Changes, the one wake loop, and the Waiter on an injected clock.

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// waitFor runs ch.Wait in the background.
func waitFor(ctx context.Context, ch *listen.Changes, until time.Time, kick <-chan struct{}) <-chan listen.Wake {
	res := make(chan listen.Wake, 1)
	go func() {
		wk, err := ch.Wait(ctx, until, kick)
		if err != nil {
			wk.Events = append(wk.Events, listen.Event{Type: "error: " + listen.EventType(err.Error())})
		}
		res <- wk
	}()
	return res
}

// armed waits until a goroutine waits on a timer of clk.
func armed(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !clk.HasWaiters(); {
		if time.Now().After(deadline) {
			t.Fatal("no timer was armed on the fake clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestChangesAnyOfManyKeys: a Changes of keys a and b wakes on a change of
// either (not of c), on a kick, and at its instant on its clock (a fake
// one: nothing else moves it); a closed Waiter wakes it with Closed.
func TestChangesAnyOfManyKeys(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	w, _ := newWaiter(t, db, listen.Options{})
	clk := clocktesting.NewFakeClock(time.Now())
	ch := listen.Subscribe(ctx, w, clk, "a", "b")
	defer ch.Close()
	for _, key := range []string{"c", "b", "a"} { // c first: it must not wake the wait
		if _, ok, err := db.c.Acquire(ctx, key, "holder", never); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	var got []string
	for len(got) < 2 {
		wk := <-waitFor(ctx, ch, time.Time{}, nil)
		if wk.Due || wk.Kicked || wk.Closed || wk.Resync() {
			t.Fatalf("%+v, want the grants of b and a", wk)
		}
		for _, ev := range wk.Events {
			got = append(got, ev.Key)
		}
	}
	if len(got) != 2 || got[0] != "b" || got[1] != "a" {
		t.Fatalf("events of %v, want b then a", got)
	}

	kick := make(chan struct{}, 1)
	res := waitFor(ctx, ch, clk.Now().Add(time.Hour), kick)
	kick <- struct{}{}
	if wk := <-res; !wk.Kicked || len(wk.Events) > 0 {
		t.Fatalf("after a kick: %+v", wk)
	}
	res = waitFor(ctx, ch, clk.Now().Add(time.Hour), nil)
	armed(t, clk)
	clk.Step(time.Hour)
	if wk := <-res; !wk.Due || len(wk.Events) > 0 {
		t.Fatalf("at the instant: %+v", wk)
	}

	res = waitFor(ctx, ch, time.Time{}, nil)
	_ = w.Close()
	if wk := <-res; !wk.Closed || !wk.Resync() {
		t.Fatalf("after Close: %+v", wk)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := errors.New("stop")
	cancel(stop)
	if _, err := ch.Wait(cctx, time.Time{}, nil); !errors.Is(err, stop) {
		t.Fatalf("after the context ended: %v, want its cause", err)
	}
}

// TestWakeAt: the earliest of an instant and the expiries of held states.
func TestWakeAt(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	if _, ok, err := db.c.Acquire(ctx, "held", "holder", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	held, err := db.c.Inspect(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	free, err := db.c.Inspect(ctx, "free")
	if err != nil {
		t.Fatal(err)
	}
	exp := held.ExpiresLocal()
	if exp.IsZero() {
		t.Fatal("a held state read without an expiry")
	}
	early, late := exp.Add(-time.Second), exp.Add(time.Second)
	for _, c := range []struct {
		until time.Time
		sts   []lease.State
		want  time.Time
	}{
		{time.Time{}, nil, time.Time{}},
		{time.Time{}, []lease.State{free, held}, exp},
		{late, []lease.State{held}, exp},
		{early, []lease.State{held, free}, early},
		{late, []lease.State{free}, late},
	} {
		if got := listen.WakeAt(c.until, c.sts...); !got.Equal(c.want) {
			t.Errorf("WakeAt(%v, %d states) = %v, want %v", c.until, len(c.sts), got, c.want)
		}
	}
}

// TestWaiterBackoffOnItsClock: the reconnection backoff runs on the
// Waiter's clock: with an hour's backoff on a fake clock, the next attempt
// comes when the clock is moved by an hour, not before.
func TestWaiterBackoffOnItsClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	rec := &recorder{ch: make(chan hookEvent, 4096)}
	w, err := listen.NewWaiterWithHook(testCtx(t), connConfig(t, "postgres://127.0.0.1:1/none?connect_timeout=10"),
		listen.Options{ConnectInBackground: true, ReconnectMin: time.Hour, ReconnectMax: time.Hour, Clock: clk}, rec.hook)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rec.next(t, listen.ConnectFailed) // NewWaiter's
	rec.next(t, listen.ConnectFailed) // the first attempt in the background
	armed(t, clk)                     // the backoff (from half an hour to an hour)
	select {
	case ev := <-rec.ch:
		t.Fatalf("%v before the backoff ended", ev.kind)
	default:
	}
	clk.Step(time.Hour)
	rec.next(t, listen.ConnectFailed)
}
