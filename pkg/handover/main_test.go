package handover_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// installMode is one way of installing pg_lease; every test runs once per
// mode (forEachMode).
type installMode struct {
	name    string
	install func(context.Context, interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}) error
	ext bool
}

var installModes = []installMode{
	{"extension", leaseadmin.InstallExtension, true},
	{"schema", leaseadmin.InstallSchema, false},
}

func testCtx(t testing.TB) context.Context { return pgtest.Context(t, 0) }

// extFiles installs the extension's files on the shared server once per
// test binary.
var extFiles struct {
	once sync.Once
	err  error
}

// testDB is a database of the test's own with pg_lease installed.
type testDB struct {
	dsn  string
	pool *pgxpool.Pool
	c    *lease.Client
}

// newDB creates a database on the shared server with pg_lease installed in
// mode m.
func newDB(t testing.TB, m installMode) *testDB {
	t.Helper()
	if m.ext {
		extFiles.once.Do(func() { extFiles.err = pgtest.Shared(t).InstallExtensionFiles(testCtx(t)) })
		if extFiles.err != nil {
			t.Fatal(extFiles.err)
		}
	}
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.NewPool(t, dsn)
	if err := m.install(testCtx(t), pool); err != nil {
		t.Fatalf("%s install: %v", m.name, err)
	}
	return &testDB{dsn: dsn, pool: pool, c: lease.New(pool)}
}

// forEachMode runs f as a subtest per install mode, each on a fresh
// database.
func forEachMode(t *testing.T, f func(t *testing.T, db *testDB)) {
	for _, m := range installModes {
		t.Run(m.name, func(t *testing.T) { f(t, newDB(t, m)) })
	}
}

func connect(t testing.TB, dsn string) *pgx.Conn { return pgtest.Connect(t, dsn) }
