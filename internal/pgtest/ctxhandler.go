package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// CheckFinishOnStop checks a connection context handler that lets a query
// whose context was cancelled finish (a stopping process sends no cancel
// request) and interrupts a query past its deadline at once. The query
// waits on an advisory lock that the test holds, so it is running when its
// context ends, and finishes only when the test lets it.
func CheckFinishOnStop(t *testing.T, handler func(*pgconn.PgConn) ctxwatch.Handler) {
	t.Helper()
	dsn := NewDatabase(t)
	ctx := Context(t, time.Minute)
	holder := Connect(t, dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = handler
	// run starts the query under qctx once the lock is held, and calls end
	// once the query waits for it.
	run := func(qctx context.Context, end func()) <-chan error {
		t.Helper()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(1)"); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := conn.Exec(qctx, "SELECT pg_advisory_xact_lock(1)")
			done <- err
		}()
		pid := conn.PgConn().PID()
		Eventually(t, time.Minute, "the query to wait for the lock", func() bool {
			var waiting bool
			err := holder.QueryRow(ctx, "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
			return err == nil && waiting
		})
		end()
		return done
	}
	unlock := func() {
		t.Helper()
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(1)"); err != nil {
			t.Fatal(err)
		}
	}

	// Cancelled while it runs: the query goes on and succeeds once the lock
	// is free.
	stop, cancel := context.WithCancel(ctx)
	done := run(stop, cancel)
	unlock()
	if err := <-done; err != nil {
		t.Fatalf("a query whose context was cancelled while it ran: %v, want it finished", err)
	}

	// Past its deadline while it runs: interrupted without the lock. Under
	// a handler that gave it 3 s or more, it would succeed once the lock is
	// freed.
	expiring := &expiringContext{Context: ctx, done: make(chan struct{})}
	done = run(expiring, func() { close(expiring.done) })
	select {
	case err = <-done:
	case <-time.After(3 * time.Second):
		unlock()
		err = <-done
	}
	if err == nil || !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a query past its deadline: %v, want it interrupted", err)
	}
}

// expiringContext is a context whose deadline passes when done is closed.
type expiringContext struct {
	context.Context
	done chan struct{}
}

func (c *expiringContext) Done() <-chan struct{} { return c.done }

func (c *expiringContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
