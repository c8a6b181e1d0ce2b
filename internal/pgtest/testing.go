package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pglease/pg_lease/internal/pgserver"
)

// New starts a throwaway server for the test (at most one Options), closes
// it with t.Cleanup, and fails the test (never skips) if it cannot start.
// When the test failed, the end of the server log is logged at cleanup.
//
// New always starts a server of the test's own, also when PGLEASE_TEST_DSN
// is set: tests that call New control the server (Kill, Freeze, clocks).
// Tests that only need a database use NewDatabase.
func New(t testing.TB, opts ...Options) *Server {
	t.Helper()
	if len(opts) > 1 {
		t.Fatalf("pgtest.New: at most one Options, got %d", len(opts))
	}
	var o Options
	if len(opts) == 1 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: server log (%s), last part:\n%s", s.LogPath(), lastBytes(s.Log(), 8<<10))
		}
		if err := s.Close(); err != nil {
			t.Errorf("pgtest: Close: %v", err)
		}
	})
	return s
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// Shared returns the server shared by the tests of this test binary
// (pgserver.Shared: the external server of PGLEASE_TEST_DSN when that is
// set, otherwise a throwaway server started on first use and closed by
// Main). Its control methods (Kill, Freeze, ...) refuse with
// ErrNeedsThrowaway. Tests on it should use a database of their own: see
// NewDatabase.
func Shared(t testing.TB) *Server {
	t.Helper()
	s, err := pgserver.Shared(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// NewDatabase creates a database of the test's own on the shared server
// (see Shared; the external server when PGLEASE_TEST_DSN is set), drops it
// at cleanup, and returns its DSN.
func NewDatabase(t testing.TB) string {
	t.Helper()
	s := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, dsn, err := s.NewDatabaseNamed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

var sharedFiles struct {
	once sync.Once
	err  error
}

// SharedExtensionFiles installs the extension's files into the shared
// server's installation once per test binary, so that a test can create
// any version of the extension.
func SharedExtensionFiles(t testing.TB) {
	t.Helper()
	sharedFiles.once.Do(func() {
		s := Shared(t) // started first: its start has its own bound
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sharedFiles.err = s.InstallExtensionFiles(ctx)
	})
	if sharedFiles.err != nil {
		t.Fatal(sharedFiles.err)
	}
}

// NewLeaseDatabase is NewDatabase with pg_lease created in the database
// (CREATE EXTENSION pg_lease). The extension's files are installed into the
// shared server's installation once per test binary.
func NewLeaseDatabase(t testing.TB) string {
	t.Helper()
	SharedExtensionFiles(t)
	dsn := NewDatabase(t)
	// The minute starts after the shared server's start (each step above
	// has its own): a cold start on a loaded machine must not eat it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// NewLeaseDatabaseOn installs pg_lease's files on srv, a server of the
// test's own (one it may stop and start), creates a database there with
// the extension, and returns its DSN. The database goes with the server.
func NewLeaseDatabaseOn(t testing.TB, srv *Server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Main runs the tests of a package (call it from TestMain), closes the
// shared server, and then, if the tests passed, checks that no goroutine
// leaked (goleak; opts add ignores). It exits with the tests' status.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	removeBuilt()
	if err := CloseShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines leaked after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
