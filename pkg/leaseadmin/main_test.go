package leaseadmin_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// installMode is one way of installing pg_lease; the tests run once per
// mode (forEachMode).
type installMode struct {
	name    string
	install func(context.Context, interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}) error
	ext bool // installed as the extension (Installed's extension)
}

var installModes = []installMode{
	{"extension", leaseadmin.InstallExtension, true},
	{"schema", leaseadmin.InstallSchema, false},
}

func testCtx(t testing.TB) context.Context { return pgtest.Context(t, 0) }

// testDB is a database of the test's own with pg_lease installed in mode.
type testDB struct {
	mode installMode
	dsn  string
	pool *pgxpool.Pool
	c    *lease.Client
}

func newPool(t testing.TB, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

func connect(t testing.TB, dsn string) *pgx.Conn { return pgtest.Connect(t, dsn) }

// forEachMode runs f as a subtest per install mode, each on a fresh
// database of the shared server (or PGLEASE_TEST_DSN's).
func forEachMode(t *testing.T, f func(t *testing.T, db *testDB)) {
	for _, m := range installModes {
		t.Run(m.name, func(t *testing.T) {
			if m.ext {
				pgtest.SharedExtensionFiles(t)
			}
			dsn := pgtest.NewDatabase(t)
			pool := newPool(t, dsn)
			if err := m.install(testCtx(t), pool); err != nil {
				t.Fatalf("%s install: %v", m.name, err)
			}
			f(t, &testDB{mode: m, dsn: dsn, pool: pool, c: lease.New(pool)})
		})
	}
}
