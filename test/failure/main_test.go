package failure

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// slots bounds how many tests of this package run servers at once: the
// machines this runs on have two cores, and `go test ./...` runs other
// packages' servers at the same time. Timing-sensitive steps keep generous
// margins anyway.
var slots = pgtest.NewSlots(4)

// env is a throwaway server of the test's own with pg_lease installed in
// database "failure".
type env struct {
	srv *pgtest.Server
	dsn string
}

const dbName = "failure"

// newEnv starts a server (opts), creates database "failure" and installs
// pg_lease there: CREATE EXTENSION from the repository's files, or, when
// PGLEASE_FAILURE_BREAK names a break, the install script with that break
// applied as a plain schema; when PGLEASE_FAILURE_SQL names a file, that
// script (break applied, if any) as a plain schema. The test runs in
// parallel with the package's others (newEnv calls t.Parallel).
func newEnv(t *testing.T, opts pgtest.Options) *env {
	t.Helper()
	t.Parallel()
	slots.Take(t, "server")
	srv := pgtest.New(t, opts)
	ctx := pgtest.Context(t, 2*time.Minute)
	dsn, err := srv.CreateDatabase(ctx, dbName)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: srv, dsn: dsn}
	conn := e.connect(t)
	defer conn.Close(ctx)
	if b, file := activeBreak(t), os.Getenv(EnvSQL); b != nil || file != "" {
		var script string
		if file != "" {
			script = pgtest.ScriptFile(t, file, EnvSQL)
		} else {
			var err error
			if script, err = pgleasesql.SchemaScript(pgtest.Superuser, ""); err != nil {
				t.Fatal(err)
			}
		}
		if b != nil {
			script = b.apply(t, script)
		}
		if _, err := conn.Exec(ctx, "BEGIN; "+script+"; COMMIT"); err != nil {
			t.Fatalf("installing pg_lease (%s=%q, %s=%q): %v", EnvSQL, file, EnvBreak, os.Getenv(EnvBreak), err)
		}
		if b != nil {
			t.Logf("BREAK %s installed: %s", b.name, b.what)
		}
		if file != "" {
			t.Logf("pg_lease installed from %s", file)
		}
		singleServer(t, conn)
		return e
	}
	if err := srv.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	checkInstalledMatchesRepo(t, conn)
	singleServer(t, conn)
	return e
}

// singleServer configures what the operator of a server without standbys
// would: promotion mode 'synchronous' (nothing acknowledged can be missing
// after a restart). A restart still moves the epoch base (afterRestart), with no
// grace: these tests are about what a restart keeps, not about the grace
// (pkg/lease TestRestartMovesEpochBaseAndStartsGrace). A script without
// lease.configure (an earlier version's) is left as it is.
func singleServer(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	if _, err := conn.Exec(pgtest.Context(t, time.Minute), `DO $$ BEGIN
  IF to_regprocedure('lease.configure(interval, text)') IS NOT NULL THEN
    PERFORM lease.configure(promotion => 'synchronous');
  END IF;
END $$`); err != nil {
		t.Fatal(err)
	}
}

// afterRestart is the epoch of the first grant of a key after a restart of
// the server, when the key's last grant, of epoch e, was made before it: one
// above the base the restart moves to (the era's next restart, the next
// multiple of 2^24).
func afterRestart(e int64) int64 { return (e>>24+1)<<24 + 1 }

// checkInstalledMatchesRepo fails the test when a function of the installed
// extension is not the repository's: the extension directory is shared by
// everything on this machine (sql/test/prove-breaks.sh overwrites it while
// it runs), and a test must never pass or fail because of someone else's
// break.
func checkInstalledMatchesRepo(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var all strings.Builder // the base script and every update script
	for _, b := range pgleasesql.Files() {
		all.Write(b)
	}
	script := all.String()
	rows, err := conn.Query(pgtest.Context(t, time.Minute), `SELECT p.proname, p.prosrc FROM pg_proc p
		JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'lease'`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var name, src string
		if err := rows.Scan(&name, &src); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.Contains(script, src) {
			t.Fatalf("installed lease.%s is not the repository's (is sql/test/prove-breaks.sh running?)", name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("only %d functions in schema lease", n)
	}
}

func (e *env) connect(t testing.TB) *pgx.Conn {
	t.Helper()
	return connectDSN(t, e.dsn)
}

func connectDSN(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnectTimeout = 5 * time.Second
	conn, err := pgx.ConnectConfig(pgtest.Context(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// client is a lease.Client on a connection of its own.
func (e *env) client(t testing.TB) *lease.Client {
	t.Helper()
	return lease.New(e.connect(t))
}

func (e *env) pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(pgtest.Context(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// row is one raw row of lease.leases (read as the superuser, who owns it).
type row struct {
	Key                   string
	Owner                 *string
	Epoch                 int64
	ExpiresAt, AcquiredAt time.Time
	LapsedOwner           *string
	LapsedEpoch           *int64
}

func (r row) String() string {
	s := func(p *string) string {
		if p == nil {
			return "NULL"
		}
		return *p
	}
	le := "NULL"
	if r.LapsedEpoch != nil {
		le = fmt.Sprint(*r.LapsedEpoch)
	}
	return fmt.Sprintf("%s owner=%s epoch=%d expires=%s acquired=%s lapsed=%s/%s", r.Key, s(r.Owner), r.Epoch,
		r.ExpiresAt.UTC().Format(time.RFC3339Nano), r.AcquiredAt.UTC().Format(time.RFC3339Nano), s(r.LapsedOwner), le)
}

func rawRows(t testing.TB, q lease.Querier) []string {
	t.Helper()
	rows, err := q.Query(pgtest.Context(t, time.Minute), `SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch
		FROM lease.leases ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var x row
		err := r.Scan(&x.Key, &x.Owner, &x.Epoch, &x.ExpiresAt, &x.AcquiredAt, &x.LapsedOwner, &x.LapsedEpoch)
		return x.String(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func rawRow(t testing.TB, q lease.Querier, key string) (row, bool) {
	t.Helper()
	var x row
	err := q.QueryRow(pgtest.Context(t, time.Minute), `SELECT key, owner, epoch, expires_at, acquired_at, lapsed_owner, lapsed_epoch
		FROM lease.leases WHERE key = $1`, key).
		Scan(&x.Key, &x.Owner, &x.Epoch, &x.ExpiresAt, &x.AcquiredAt, &x.LapsedOwner, &x.LapsedEpoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return x, true
}

// stateString is a State without ServerNow, for comparisons.
func stateString(s lease.State) string {
	exp := ""
	if !s.ExpiresAt.IsZero() {
		exp = s.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	acq := ""
	if !s.AcquiredAt.IsZero() {
		acq = s.AcquiredAt.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("%s exists=%t held=%t owner=%q epoch=%d expires=%s acquired=%s",
		s.Key, s.Exists, s.Held, s.Owner, s.Epoch, exp, acq)
}

func listStates(t testing.TB, c *lease.Client) []string {
	t.Helper()
	ss, err := c.List(pgtest.Context(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = stateString(s)
	}
	return out
}

func inspect(t testing.TB, c *lease.Client, key string) lease.State {
	t.Helper()
	s, err := c.Inspect(pgtest.Context(t, time.Minute), key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustAcquire(t testing.TB, c *lease.Client, key, owner string, ttl time.Duration) lease.Grant {
	t.Helper()
	g, ok, err := c.Acquire(pgtest.Context(t, time.Minute), key, owner, ttl)
	if err != nil || !ok {
		t.Fatalf("acquire %s by %s: ok=%t err=%v", key, owner, ok, err)
	}
	return g
}

func mustRelease(t testing.TB, c *lease.Client, g lease.Grant) {
	t.Helper()
	if err := c.Release(pgtest.Context(t, time.Minute), g.Token); err != nil {
		t.Fatalf("release %v: %v", g.Token, err)
	}
}

// waitLocalPast sleeps until the local wall clock (the same host clock the
// server reads, when the server's clock is not faked) has passed ts by
// margin: for waits while the server is down.
func waitLocalPast(ts time.Time, margin time.Duration) {
	if d := time.Until(ts.Add(margin)); d > 0 {
		time.Sleep(d)
	}
}

// backendGone waits until pid is no longer in pg_stat_activity.
func backendGone(t testing.TB, q lease.Querier, pid uint32) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, fmt.Sprintf("backend %d to exit", pid), func() bool {
		var n int
		if err := q.QueryRow(pgtest.Context(t, time.Minute), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int64(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}
