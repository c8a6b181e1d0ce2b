package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// installMode is one way of installing pg_lease; every API test runs once
// per mode (forEachMode).
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

const never = time.Hour // a poll or TTL that no test waits for

func testCtx(t testing.TB) context.Context { return pgtest.Context(t, 0) }

// extFiles makes the extension's files available to each server once per
// test binary (the shared server and any server of a test's own share the
// installation, but an external server is checked rather than written).
var extFiles struct {
	mu   sync.Mutex
	done map[*pgtest.Server]bool
}

func ensureExtensionFiles(t testing.TB, s *pgtest.Server) {
	t.Helper()
	extFiles.mu.Lock()
	defer extFiles.mu.Unlock()
	if extFiles.done[s] {
		return
	}
	if err := s.InstallExtensionFiles(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if extFiles.done == nil {
		extFiles.done = map[*pgtest.Server]bool{}
	}
	extFiles.done[s] = true
}

// testDB is a database of the test's own with pg_lease installed in mode.
type testDB struct {
	dsn  string
	mode installMode
	pool *pgxpool.Pool
	c    *lease.Client
}

func newPool(t testing.TB, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

func connect(t testing.TB, dsn string) *pgx.Conn { return pgtest.Connect(t, dsn) }

// newDB creates a database on the shared server (or PGLEASE_TEST_DSN) with
// pg_lease installed in mode m.
func newDB(t testing.TB, m installMode) *testDB {
	t.Helper()
	if m.ext {
		ensureExtensionFiles(t, pgtest.Shared(t))
	}
	return installInto(t, pgtest.NewDatabase(t), m)
}

// newDBOn is newDB on a server of the test's own.
func newDBOn(t testing.TB, s *pgtest.Server, m installMode) *testDB {
	t.Helper()
	if m.ext {
		ensureExtensionFiles(t, s)
	}
	dsn, err := s.NewDatabase(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return installInto(t, dsn, m)
}

func installInto(t testing.TB, dsn string, m installMode) *testDB {
	t.Helper()
	pool := newPool(t, dsn)
	if err := m.install(testCtx(t), pool); err != nil {
		t.Fatalf("%s install: %v", m.name, err)
	}
	return &testDB{dsn: dsn, mode: m, pool: pool, c: lease.New(pool)}
}

// forEachMode runs f as a subtest per install mode, each on a fresh
// database.
func forEachMode(t *testing.T, f func(t *testing.T, db *testDB)) {
	for _, m := range installModes {
		t.Run(m.name, func(t *testing.T) { f(t, newDB(t, m)) })
	}
}
