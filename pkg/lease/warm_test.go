package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// preparedStatements lists the statements prepared on conn (pgx's
// statement cache: one per distinct SQL text it ran).
func preparedStatements(t *testing.T, ctx context.Context, conn *pgx.Conn) string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT statement FROM pg_prepared_statements ORDER BY statement`,
		pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(s, "\n")
}

// WarmConn runs the client's four calls on the connection (they stay
// prepared there: pg_prepared_statements) and leaves nothing behind: no row,
// no epoch used up, no notification, no open transaction.
func TestWarmConnLeavesNothing(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		if _, _, err := db.c.Acquire(ctx, "job", "alice", time.Minute); err != nil {
			t.Fatal(err)
		}
		// A listener of every key (pglease watch without keys registers '*'),
		// so that anything the warm-up committed would be notified.
		ln := connect(t, db.dsn)
		if _, err := ln.Exec(ctx, `LISTEN pg_lease`); err != nil {
			t.Fatal(err)
		}
		if _, err := ln.Exec(ctx, `SELECT lease.listen('*')`); err != nil {
			t.Fatal(err)
		}
		var before string
		if err := db.pool.QueryRow(ctx, `SELECT string_agg(format('%s/%s/%s', key, owner, epoch), ',' ORDER BY key) FROM lease.leases`).Scan(&before); err != nil {
			t.Fatal(err)
		}

		conn := connect(t, db.dsn)
		if err := lease.WarmConn(ctx, conn); err != nil {
			t.Fatal(err)
		}
		if s := conn.PgConn().TxStatus(); s != 'I' {
			t.Fatalf("after WarmConn the connection's transaction status is %q, want idle", s)
		}
		ps := preparedStatements(t, ctx, conn)
		for _, f := range []string{"lease.inspect(", "lease.acquire(", "lease.renew(", "lease.release("} {
			if !strings.Contains(ps, f) {
				t.Errorf("after WarmConn no statement calling %s is prepared on the connection; prepared:\n%s", f, ps)
			}
		}

		var after string
		if err := db.pool.QueryRow(ctx, `SELECT string_agg(format('%s/%s/%s', key, owner, epoch), ',' ORDER BY key) FROM lease.leases`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("lease.leases changed by WarmConn:\nbefore %s\nafter  %s", before, after)
		}
		// Notifications arrive in commit order: the first one the listener
		// gets must be this release, not anything of the warm-up.
		if err := db.c.Release(ctx, lease.Token{Key: "job", Owner: "alice", Epoch: 1}); err != nil {
			t.Fatal(err)
		}
		n, err := ln.WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(n.Payload, `"key" : "job"`) && !strings.Contains(n.Payload, `"key":"job"`) {
			t.Fatalf("first notification after WarmConn: %s, want the release of job", n.Payload)
		}
		// The connection works for the real calls, and the next grant of a
		// new key still starts at epoch 1.
		c := lease.New(conn)
		g, ok, err := c.Acquire(ctx, "fresh", "bob", time.Minute)
		if err != nil || !ok || g.Epoch != 1 {
			t.Fatalf("Acquire after WarmConn: %+v %v %v, want epoch 1", g, ok, err)
		}
	})
}

// The warm-up takes every path of a handoff to its end: its last step, a
// release, hands the key to the candidate it registered. WarmConn's
// rollback then leaves no strategy, registration or history behind.
func TestWarmConnTakesEveryHandoffPath(t *testing.T) {
	forEachMode(t, func(t *testing.T, db *testDB) {
		ctx := testCtx(t)
		conn := connect(t, db.dsn)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := lease.Warm(ctx, lease.New(tx), "pg_lease/warm-up/test"); err != nil {
			t.Fatalf("the warm-up stopped early: %v", err)
		}
		var owner string
		var epoch int64
		if err := tx.QueryRow(ctx, `SELECT owner, epoch FROM lease.inspect('pg_lease/warm-up/test')`).Scan(&owner, &epoch); err != nil {
			t.Fatal(err)
		}
		if owner != "pg_lease/warm-up/candidate" {
			t.Fatalf("after the warm-up the key is held by %q (epoch %d), want the candidate it was handed to", owner, epoch)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		if err := lease.WarmConn(ctx, conn); err != nil {
			t.Fatal(err)
		}
		var left int
		if err := db.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM lease.candidates) + (SELECT count(*) FROM lease.strategies)
		                                       + (SELECT count(*) FROM lease.history WHERE key LIKE 'pg_lease/warm-up/%')`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Fatalf("WarmConn left %d candidate, strategy or history rows", left)
		}
	})
}

// On a database without pg_lease, WarmConn leaves the connection usable and
// says nothing: the calls that follow report the cause (ErrNotInstalled).
func TestWarmConnWithoutTheExtension(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	conn := connect(t, dsn)
	if err := lease.WarmConn(ctx, conn); err != nil {
		t.Fatalf("WarmConn without the extension: %v, want nil", err)
	}
	if s := conn.PgConn().TxStatus(); s != 'I' {
		t.Fatalf("transaction status %q, want idle", s)
	}
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 after WarmConn: %v %v", one, err)
	}
	if _, err := lease.New(conn).Inspect(ctx, "k"); !errors.Is(err, lease.ErrNotInstalled) {
		t.Fatalf("Inspect without the extension: %v, want ErrNotInstalled", err)
	}
}

// A dead connection is the one thing WarmConn reports: a pool must not hand
// it out.
func TestWarmConnOnAClosedConnection(t *testing.T) {
	ctx := testCtx(t)
	db := newDB(t, installModes[0])
	conn := connect(t, db.dsn)
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease.WarmConn(ctx, conn); err == nil {
		t.Fatal("WarmConn on a closed connection: nil error")
	}
}

// As a pool's AfterConnect hook, every connection the pool opens is warm.
func TestWarmConnAsAfterConnect(t *testing.T) {
	ctx := testCtx(t)
	db := newDB(t, installModes[0])
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = lease.WarmConn
	cfg.MinConns, cfg.MaxConns = 2, 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for i := 0; i < 2; i++ {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		if ps := preparedStatements(t, ctx, c.Conn()); !strings.Contains(ps, "lease.acquire(") {
			t.Fatalf("pooled connection %d not warm; prepared:\n%s", i, ps)
		}
	}
}

// BenchmarkFirstCallsOnANewConnection measures what WarmConn saves: the
// first inspect, acquire and release on a connection just opened (a
// follower's read and grant, a leader's one release), cold and after
// WarmConn (its own cost is not timed: it runs when a pool opens the
// connection, off the handoff's path). Both in the same run:
//
//	go test ./pkg/lease -run '^$' -bench FirstCalls -benchtime 200x
func BenchmarkFirstCallsOnANewConnection(b *testing.B) {
	db := newDB(b, installModes[0])
	ctx := testCtx(b)
	for _, warm := range []bool{false, true} {
		name := "cold"
		if warm {
			name = "warm"
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				conn, err := pgx.Connect(ctx, db.dsn)
				if err != nil {
					b.Fatal(err)
				}
				if warm {
					if err := lease.WarmConn(ctx, conn); err != nil {
						b.Fatal(err)
					}
				}
				c := lease.New(conn)
				b.StartTimer()
				if _, err := c.Inspect(ctx, "first-calls"); err != nil {
					b.Fatal(err)
				}
				g, ok, err := c.Acquire(ctx, "first-calls", "bench", time.Minute)
				if err != nil || !ok {
					b.Fatal(ok, err)
				}
				if err := c.Release(ctx, g.Token); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				_ = conn.Close(ctx)
				b.StartTimer()
			}
		})
	}
}
