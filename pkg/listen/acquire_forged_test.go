package listen_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// acquireSignal is a Querier that counts lease.acquire calls and signals
// each one's answer.
type acquireSignal struct {
	lease.Querier
	acquires atomic.Int64
	done     chan struct{}
}

func (q *acquireSignal) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := q.Querier.QueryRow(ctx, sql, args...)
	if strings.Contains(sql, "lease.acquire") {
		q.acquires.Add(1)
		return signalRow{row, q.done}
	}
	return row
}

// TestAwaitAcquireForgedReleases: a session of any role sends, on channel
// pg_lease, forged releases of a key another owner holds (NOTIFY needs no
// privilege). Each forged release costs the waiters of one Waiter one
// denied acquire between them, never more; the holder keeps its grant and
// epoch, no waiter returns, and the holder's real release then gives the key
// to one of them.
func TestAwaitAcquireForgedReleases(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	w, _ := newWaiter(t, db, listen.Options{})
	h, ok, err := db.c.Acquire(ctx, "forged", "holder", never)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	reads := make(chan struct{}, 64)
	q := &acquireSignal{Querier: readSignal{Querier: db.pool, reads: reads}, done: make(chan struct{}, 64)}
	c := lease.New(q)
	const n, forged = 4, 5
	res := make(chan acquired, n)
	for i := range n {
		go func() {
			g, err := listen.AwaitAcquire(ctx, w, c, "forged", fmt.Sprintf("w%d", i), never, never)
			res <- acquired{g, err}
		}()
	}
	for range n {
		<-reads // each waiter's first read saw the key held
	}
	hostile := connect(t, db.dsn)
	for i := range forged {
		payload := fmt.Sprintf(`{"event":"released","key":"forged","owner":"holder","epoch":%d}`, h.Epoch)
		if _, err := hostile.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
			t.Fatal(err)
		}
		<-q.done // the one acquire this forged release caused, denied
		if a := q.acquires.Load(); a != int64(i+1) {
			t.Fatalf("%d acquires after %d forged releases, want %d", a, i+1, i+1)
		}
	}
	select {
	case r := <-res:
		t.Fatalf("a waiter returned on forged releases: %+v %v", r.g, r.err)
	default:
	}
	st, err := db.c.Inspect(ctx, "forged")
	if err != nil || !st.Held || st.Owner != "holder" || st.Epoch != h.Epoch {
		t.Fatalf("after forged releases: %+v %v, want held by holder at epoch %d", st, err, h.Epoch)
	}
	if err := db.c.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	if r := <-res; r.err != nil || !strings.HasPrefix(r.g.Owner, "w") || r.g.Epoch <= h.Epoch {
		t.Fatalf("after the real release: %+v %v", r.g, r.err)
	}
}
