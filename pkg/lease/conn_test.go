package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestReleaseSurvivesADeadPooledConnection: the only pooled connection's
// backend is terminated while idle (as at a server-side shutdown of idle
// sessions); the next Release fails on it with a connection-level error,
// and the client sends it once more on a new connection, which frees the
// key. client-go's own release calls the lock once and retries only on a
// Conflict.
func TestReleaseSurvivesADeadPooledConnection(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, db.dsn, pgtest.MaxConns(1))
	c := lease.New(pool)
	for _, call := range []string{"release", "renew", "inspect"} {
		g, ok, err := c.Acquire(ctx, "dead-conn/"+call, "a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		var pid int
		if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := db.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		for { // until the backend is gone (a wait on the server, not a sleep)
			var n int
			if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		switch call {
		case "release":
			err = c.Release(ctx, g.Token)
		case "renew":
			_, err = c.Renew(ctx, g.Token, time.Minute)
		case "inspect":
			_, err = c.Inspect(ctx, g.Key)
		}
		if err != nil {
			t.Fatalf("%s on a pool whose connection died: %v", call, err)
		}
	}
	if s, err := db.c.Inspect(ctx, "dead-conn/release"); err != nil || s.Held {
		t.Fatalf("after the retried release: %+v, %v", s, err)
	}
}

// TestReadOnly: a call on a read-only session matches ErrReadOnly (as on a
// standby).
func TestReadOnly(t *testing.T) {
	db := newDB(t, installModes[0])
	ctx := testCtx(t)
	conn := connect(t, db.dsn)
	if _, err := conn.Exec(ctx, `SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lease.New(conn).Acquire(ctx, "ro", "a", time.Minute); !errors.Is(err, lease.ErrReadOnly) {
		t.Fatalf("acquire on a read-only session: %v, want ErrReadOnly", err)
	}
}
