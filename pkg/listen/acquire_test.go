package listen_test

// AwaitAcquire: the waiters of one Waiter send one acquire per wake-up.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// countedCalls is a Querier that counts the lease.inspect and lease.acquire
// calls it runs, and holds acquires at the gate when one is set.
type countedCalls struct {
	lease.Querier
	reads, acquires atomic.Int64
	readDone        chan struct{} // a receive per lease.inspect read
	mu              sync.Mutex
	gate            chan struct{}
}

func (q *countedCalls) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	switch {
	case strings.Contains(sql, "lease.inspect"):
		q.reads.Add(1)
		return signalRow{q.Querier.QueryRow(ctx, sql, args...), q.readDone}
	case strings.Contains(sql, "lease.acquire"):
		q.acquires.Add(1)
		q.mu.Lock()
		g := q.gate
		q.mu.Unlock()
		if g != nil {
			<-g
		}
	}
	return q.Querier.QueryRow(ctx, sql, args...)
}

func (q *countedCalls) setGate(g chan struct{}) {
	q.mu.Lock()
	q.gate = g
	q.mu.Unlock()
}

type acquired struct {
	g   lease.Grant
	err error
}

// TestAwaitAcquireOneAcquirePerRelease (the herd): n waiters of one key
// behind one Waiter. Each release wakes them with one acquire between
// them: while the first one's acquire is held at the gate, every other
// waiter joins it. Its waiter gets the key; the others keep waiting (each
// gets the key once, at a later release), and the grant's notification
// costs no read: after the first reads, n releases cost n acquires.
func TestAwaitAcquireOneAcquirePerRelease(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		w, rec := newWaiter(t, db, listen.Options{})
		q := &countedCalls{Querier: db.pool, readDone: make(chan struct{}, 64)}
		c := lease.New(q)
		h, ok, err := db.c.Acquire(ctx, "herd", "holder", never)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		const n = 6
		res := make(chan acquired, n)
		for i := range n {
			go func() {
				g, err := listen.AwaitAcquire(ctx, w, c, "herd", "w"+string(rune('a'+i)), never, never)
				res <- acquired{g, err}
			}()
		}
		for range n {
			<-q.readDone // each waiter's first read saw the key held
		}
		won := map[string]bool{}
		held := h.Token
		for round := range n {
			gate := make(chan struct{})
			q.setGate(gate)
			if err := db.c.Release(ctx, held); err != nil {
				t.Fatal(err)
			}
			for range n - 1 - round {
				rec.next(t, listen.AcquireShared)
			}
			q.setGate(nil)
			close(gate)
			r := <-res
			if r.err != nil || won[r.g.Owner] || r.g.Epoch <= held.Epoch {
				t.Fatalf("round %d: %+v %v after %v (won: %v)", round, r.g, r.err, held, won)
			}
			won[r.g.Owner], held = true, r.g.Token
		}
		if a, rd := q.acquires.Load(), q.reads.Load(); a != n || rd != n {
			t.Fatalf("%d acquires and %d reads for %d waiters over %d releases, want %d and %d", a, rd, n, n, n, n)
		}
	})
}

// TestAwaitAcquireReadsAfterABusyDenial: a wait-0 acquire is denied while
// another transaction keeps the key's row locked, though nobody holds the
// key, and no grant is notified. The waiter reads again a second later on
// its client's clock (a fake one: nothing else wakes it, the poll and the
// TTL are an hour), finds the key free and takes it.
func TestAwaitAcquireReadsAfterABusyDenial(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	w, _ := newWaiter(t, db, listen.Options{})
	h, ok, err := db.c.Acquire(ctx, "busy", "holder", never)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := db.c.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	w.Watch(ctx, "busy") // registered now: the lock below does not hold up the registration
	locker := connect(t, db.dsn)
	if _, err := locker.Exec(ctx, `BEGIN; SELECT FROM lease.leases WHERE key = 'busy' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	q := &countedCalls{Querier: db.pool, readDone: make(chan struct{}, 64)}
	res := make(chan acquired, 1)
	go func() {
		g, err := listen.AwaitAcquire(ctx, w, lease.New(q).WithClock(clk), "busy", "me", never, never)
		res <- acquired{g, err}
	}()
	armed(t, clk) // denied: it waits
	if n := q.acquires.Load(); n != 1 {
		t.Fatalf("%d acquires before the wait, want the one denied", n)
	}
	if _, err := locker.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	if r := <-res; r.err != nil || r.g.Owner != "me" || r.g.Epoch <= h.Epoch {
		t.Fatalf("AwaitAcquire: %+v %v", r.g, r.err)
	}
}
