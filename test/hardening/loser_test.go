package hardening

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// waitEvent polls pg_stat_activity until backend pid shows the given wait
// event type and event (an empty event matches any event of the type).
func waitEvent(ctx context.Context, t *testing.T, obs *pgx.Conn, pid uint32, typ, event string) {
	t.Helper()
	for {
		var ok bool
		if err := obs.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE pid = $1 AND wait_event_type = $2 AND ($3 = '' OR wait_event = $3))`,
			pid, typ, event).Scan(&ok); err != nil {
			t.Fatalf("waiting for backend %d to wait on %s %s: %v", pid, typ, event, err)
		}
		if ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWaitingLoserKeepsNoLock: a blocking acquire that waited for another
// session's uncommitted takeover of the key, and found the key granted once
// it had the row lock, polls without that lock. Inside its open transaction
// the new holder still renews and releases at once: each runs under a
// lock_timeout that a kept lock would exceed (55P03), and the waiter then
// takes the released key.
func TestWaitingLoserKeepsNoLock(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	ctx := pgtest.Context(t, 2*time.Minute)
	holder := pgtest.Connect(t, dsn)
	defer holder.Close(ctx)
	loser := pgtest.Connect(t, dsn)
	defer loser.Close(ctx)
	obs := pgtest.Connect(t, dsn)
	defer obs.Close(ctx)

	// The key exists and is free: the loser's read finds it so and goes for
	// the row lock.
	if _, err := holder.Exec(ctx, `SELECT lease.acquire('wl', 'old', '1 min');
		SELECT lease.release('wl', 'old', 1)`); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var epoch int64
	if err := tx.QueryRow(ctx, `SELECT epoch FROM lease.acquire('wl', 'h', '1 hour')`).Scan(&epoch); err != nil {
		t.Fatal(err)
	}

	ltx, err := loser.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ltx.Rollback(ctx) }()
	type result struct {
		acquired bool
		err      error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = ltx.QueryRow(ctx, `SELECT acquired FROM lease.acquire('wl', 'l', '1 min', '1 min')`).Scan(&r.acquired)
		done <- r
	}()
	pid := loser.PgConn().PID()
	waitEvent(ctx, t, obs, pid, "Lock", "") // behind the uncommitted takeover's row lock
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, obs, pid, "Timeout", "PgSleep") // found the key granted: polls

	for _, q := range []string{
		`SELECT status FROM lease.renew('wl', 'h', $1, '1 hour')`,
		`SELECT status FROM lease.release('wl', 'h', $1)`,
	} {
		var status string
		err := pgx.BeginFunc(ctx, holder, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, q, epoch).Scan(&status)
		})
		if err != nil || status != "ok" {
			t.Fatalf("%s while the loser polls: %q, %v (a lock_timeout: the loser kept the row lock)", q, status, err)
		}
	}
	select {
	case r := <-done:
		if r.err != nil || !r.acquired {
			t.Fatalf("the waiting acquire after the release: %v, %v", r.acquired, r.err)
		}
	case <-ctx.Done():
		t.Fatal("the waiting acquire did not return after the release")
	}
	if err := ltx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
