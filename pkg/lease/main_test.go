package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const never = time.Hour // a poll or TTL that no test waits for

func testCtx(t testing.TB) context.Context { return pgtest.Context(t, 0) }

func newPool(t testing.TB, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

func connect(t testing.TB, dsn string) *pgx.Conn { return pgtest.Connect(t, dsn) }

// installModes: as the extension and as a plain schema. API tests run
// once per mode (forEachMode).
var installModes = pgtest.Installs

// testDB is a database of the test's own with pg_lease installed.
type testDB struct {
	dsn  string
	pool *pgxpool.Pool
	c    *lease.Client
}

// newDB creates a database on the shared server (or PGLEASE_TEST_DSN's)
// with pg_lease installed in mode m.
func newDB(t testing.TB, m pgtest.Install) *testDB { t.Helper(); return open(t, m.NewDatabase(t)) }

// newDBOn is newDB on a server of the test's own.
func newDBOn(t testing.TB, s *pgtest.Server, m pgtest.Install) *testDB {
	t.Helper()
	return open(t, m.NewDatabaseOn(t, s))
}

func open(t testing.TB, dsn string) *testDB {
	pool := newPool(t, dsn)
	return &testDB{dsn: dsn, pool: pool, c: lease.New(pool)}
}

// forEachMode runs f as a subtest per install mode, each on a fresh
// database.
func forEachMode(t *testing.T, f func(t *testing.T, db *testDB)) {
	pgtest.ForEachInstall(t, func(t *testing.T, _ pgtest.Install, dsn string) { f(t, open(t, dsn)) })
}
