package pgtest

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func connect(t *testing.T, dsn string) *pgx.Conn { return Connect(t, dsn) }

func exec1(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(Context(t, time.Minute), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestSharedDatabases(t *testing.T) {
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatal("same database twice")
	}
	exec1(t, connect(t, a), "CREATE TABLE only_in_a (x int)")
	exec1(t, connect(t, b), "CREATE TABLE only_in_a (x int)")
	s := Shared(t)
	if s != Shared(t) {
		t.Fatal("Shared returned two servers")
	}
	for name, op := range map[string]func() error{
		"Kill": s.Kill, "Stop": s.Stop, "Freeze": s.Freeze, "Thaw": s.Thaw,
		"SetClockOffset": func() error { return s.SetClockOffset(time.Second) },
	} {
		if err := op(); !errors.Is(err, ErrNeedsThrowaway) {
			t.Errorf("%s on the shared server: %v", name, err)
		}
	}
}

func TestNewLeasePool(t *testing.T) {
	pool := NewLeasePool(t, MaxConns(2))
	var v string
	if err := pool.QueryRow(Context(t, 0), "SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'").Scan(&v); err != nil || v == "" {
		t.Fatalf("pg_lease in the new database: %q, %v", v, err)
	}
	if pool.Config().MaxConns != 2 {
		t.Fatalf("MaxConns = %d", pool.Config().MaxConns)
	}
}
