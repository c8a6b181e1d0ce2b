package listen_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const never = time.Hour // a poll or TTL that no test waits for

func testCtx(t testing.TB) context.Context { return pgtest.Context(t, 0) }

func newPool(t testing.TB, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

func connect(t testing.TB, dsn string) *pgx.Conn { return pgtest.Connect(t, dsn) }

// connConfig parses dsn for NewWaiter.
func connConfig(t testing.TB, dsn string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// installMode is one way of installing pg_lease: it returns the DSN of a
// database of the test's own on the shared server with pg_lease in it.
type installMode struct {
	name  string
	newDB func(testing.TB) string
}

// installModes: as the extension, and as a plain schema. The Waiter's
// tests run once per mode (forEachMode).
var installModes = []installMode{
	{"extension", pgtest.NewLeaseDatabase},
	{"schema", func(t testing.TB) string {
		t.Helper()
		dsn := pgtest.NewDatabase(t)
		if err := leaseadmin.InstallSchema(testCtx(t), newPool(t, dsn)); err != nil {
			t.Fatalf("schema install: %v", err)
		}
		return dsn
	}},
}

// testDB is a database of the test's own with pg_lease installed.
type testDB struct {
	dsn  string
	pool *pgxpool.Pool
	c    *lease.Client
}

func newDB(t testing.TB, m installMode) *testDB {
	t.Helper()
	dsn := m.newDB(t)
	pool := newPool(t, dsn)
	return &testDB{dsn: dsn, pool: pool, c: lease.New(pool)}
}

// forEachMode runs f as a subtest per install mode, each on a fresh
// database.
func forEachMode(t *testing.T, f func(t *testing.T, db *testDB)) {
	for _, m := range installModes {
		t.Run(m.name, func(t *testing.T) { f(t, newDB(t, m)) })
	}
}
