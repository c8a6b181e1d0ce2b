package elector_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/listen"
)

// countingQuerier counts the lease.acquire calls sent through it.
type countingQuerier struct {
	*pgxpool.Pool
	acquires atomic.Int64
}

func (q *countingQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "lease.acquire(") {
		q.acquires.Add(1)
	}
	return q.Pool.QueryRow(ctx, sql, args...)
}

// TestFollowersSleepThroughGrace: three candidates, with and without a
// Waiter, start on a key during the grace after a (simulated) promotion.
// Each is denied with the grace's end and sleeps until then: a handful of
// acquires in all, not one per round trip (before 0.4.0 a candidate asked
// again at once, about 1,900 times a second), and one leads after the grace.
func TestFollowersSleepThroughGrace(t *testing.T) {
	for _, withWaiter := range []bool{true, false} {
		t.Run(fmt.Sprintf("waiter=%t", withWaiter), func(t *testing.T) {
			ctx := testCtx(t)
			dsn := pgtest.NewDatabase(t)
			pool := newPool(t, dsn)
			// The SQL embedded in this build (no shared extension files).
			if err := leaseadmin.InstallSchema(ctx, pool); err != nil {
				t.Fatal(err)
			}
			const grace = 3 * time.Second
			execSQL(t, pool, "SELECT lease.configure(max_ttl => '3s')")
			execSQL(t, pool, "UPDATE lease.timeline_state SET timeline = 0")           // the promotion, as the SQL sees one,
			execSQL(t, pool, "UPDATE lease.leases SET life = life - interval '1 day'") // rows of the old primary's postmaster,
			execSQL(t, pool, "CHECKPOINT")                                             // which requests a checkpoint at once
			q := &countingQuerier{Pool: pool}
			client := lease.New(q)
			var w *listen.Waiter
			if withWaiter {
				cfg, err := pgx.ParseConfig(dsn)
				if err != nil {
					t.Fatal(err)
				}
				if w, err = listen.NewWaiter(ctx, cfg, listen.Options{}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { w.Close() })
			}
			rec := newRecorder()
			for i := range 3 {
				id := fmt.Sprintf("c%d", i)
				var el *elector.Elector
				var err error
				el, err = elector.New(client, elector.Config{Key: "k", Identity: id, TTL: grace,
					RenewInterval: time.Second, Waiter: w, Callbacks: rec.callbacks(id, &el, nil)})
				if err != nil {
					t.Fatal(err)
				}
				runElector(t, el)
			}
			tr := waitTerm(t, rec.events, time.Minute)
			n := q.acquires.Load()
			var graceUntil, acquiredAt time.Time
			if err := pool.QueryRow(ctx, `SELECT s.grace_until, l.acquired_at FROM lease.status() s, lease.list() l
			    WHERE l.key = 'k'`).Scan(&graceUntil, &acquiredAt); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s led %v after the grace ended (server clock); %d acquires in all by three candidates",
				tr.id, acquiredAt.Sub(graceUntil).Round(time.Millisecond), n)
			if acquiredAt.Before(graceUntil) {
				t.Fatalf("granted at %v, before the grace ended at %v", acquiredAt, graceUntil)
			}
			// Each candidate: one denied acquire, one after its sleep, and a
			// few more if the leader's grant raced them.
			if n > 12 {
				t.Fatalf("%d acquires by three candidates through a %v grace: they asked again instead of sleeping until its end", n, grace)
			}
		})
	}
}

// TestFollowerWaitsOutAChangeInFlight: the key reads free, but another
// transaction holds its row (a grant not yet committed, as one whose commit
// waits for the synchronous standbys after a promotion). The follower is
// refused, reads the key free, and pauses 50 ms (at most RetryInterval)
// before asking again, instead of asking at once, in a loop, until that
// transaction ends. When the transaction rolls back, the follower leads.
func TestFollowerWaitsOutAChangeInFlight(t *testing.T) {
	ctx := testCtx(t)
	dsn := installed(t, nil)
	pool := newPool(t, dsn)
	c := lease.New(pool)
	g, ok, err := c.Acquire(ctx, "k", "before", time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, ok, err := lease.New(tx).Acquire(ctx, "k", "in-flight", time.Minute); err != nil || !ok {
		t.Fatalf("acquire in the open transaction: %v %v", ok, err)
	}

	const retry = 50 * time.Millisecond // the pause after such a refusal is min(RetryInterval, 50ms)
	q := &countingQuerier{Pool: pool}
	rec := newRecorder()
	var el *elector.Elector
	el, err = elector.New(lease.New(q), elector.Config{Key: "k", Identity: "follower", TTL: 3 * time.Second,
		RetryInterval: retry, Callbacks: rec.callbacks("follower", &el, nil)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	runElector(t, el)
	time.Sleep(time.Second) // the window observed, not a bound the server must agree with
	n, window := q.acquires.Load(), time.Since(start)
	// One acquire per pause, and one more at the start.
	if limit := int64(window/retry) + 2; n > limit {
		t.Fatalf("%d acquires in %v while another transaction held the key's row (RetryInterval %v, at most %d expected): the follower asked again at once",
			n, window.Round(time.Millisecond), retry, limit)
	}
	t.Logf("%d acquires in %v while the key's row was locked", n, window.Round(time.Millisecond))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if tr := waitTerm(t, rec.events, time.Minute); tr.id != "follower" {
		t.Fatalf("term of %s", tr.id)
	}
}
