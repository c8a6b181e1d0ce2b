package handover_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// installModes: as the extension and as a plain schema. API tests run
// once per mode (forEachMode).
var installModes = pgtest.Installs

func testCtx(t testing.TB) context.Context { return pgtest.Context(t, 0) }

// testDB is a database of the test's own with pg_lease installed.
type testDB struct {
	dsn  string
	pool *pgxpool.Pool
	c    *lease.Client
}

// newDB creates a database on the shared server (or PGLEASE_TEST_DSN's)
// with pg_lease installed in mode m.
func newDB(t testing.TB, m pgtest.Install) *testDB { t.Helper(); return open(t, m.NewDatabase(t)) }

func open(t testing.TB, dsn string) *testDB {
	pool := pgtest.NewPool(t, dsn)
	return &testDB{dsn: dsn, pool: pool, c: lease.New(pool)}
}

// forEachMode runs f as a subtest per install mode, each on a fresh
// database.
func forEachMode(t *testing.T, f func(t *testing.T, db *testDB)) {
	pgtest.ForEachInstall(t, func(t *testing.T, _ pgtest.Install, dsn string) { f(t, open(t, dsn)) })
}

func connect(t testing.TB, dsn string) *pgx.Conn { return pgtest.Connect(t, dsn) }
