package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The helpers every suite wrote for itself (testCtx, newPool, connect,
// newDB), written once.

// Context returns a context cancelled at the test's cleanup, or at its
// deadline: the test binary's own (go test -timeout) less reportMargin, so
// that a stuck test fails with its own message, and never sooner than d (2
// minutes when d is zero) from now. d is a floor, not a budget: a loaded
// machine runs a test's work more slowly, and a test must not fail for that.
func Context(t testing.TB, d time.Duration) context.Context {
	if d == 0 {
		d = 2 * time.Minute
	}
	deadline := time.Now().Add(d)
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := dt.Deadline(); ok && end.Add(-reportMargin).After(deadline) {
			deadline = end.Add(-reportMargin)
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// reportMargin is the time left, after a test's context ends at the test
// binary's deadline, for the test to fail and report before go test stops
// the binary.
const reportMargin = 30 * time.Second

// PoolOption adjusts a pool's configuration before NewPool opens it.
type PoolOption func(*pgxpool.Config)

// MaxConns sets the pool's MaxConns.
func MaxConns(n int32) PoolOption { return func(c *pgxpool.Config) { c.MaxConns = n } }

// ConnectTimeout sets the timeout of each connection attempt.
func ConnectTimeout(d time.Duration) PoolOption {
	return func(c *pgxpool.Config) { c.ConnConfig.ConnectTimeout = d }
}

// NewPool opens a pgxpool on dsn, closed at cleanup; it fails the test if
// the DSN does not parse (pools connect lazily: a dead server shows up on
// first use).
func NewPool(t testing.TB, dsn string, opts ...PoolOption) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Connect opens one connection on dsn, closed at cleanup.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(Context(t, time.Minute), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// NewLeasePool is NewPool on a NewLeaseDatabase: a fresh database with
// pg_lease created.
func NewLeasePool(t testing.TB, opts ...PoolOption) *pgxpool.Pool {
	t.Helper()
	return NewPool(t, NewLeaseDatabase(t), opts...)
}
