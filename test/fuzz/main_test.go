package fuzz

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// EnvSQL names a script to install as a plain schema instead of the
// extension (hack/mutate.py points it at mutants).
const EnvSQL = "PGLEASE_FUZZ_SQL"

// harness is one database with pg_lease, shared by every input of a target
// (inputs run one at a time in a fuzz worker).
type harness struct {
	pool    *pgxpool.Pool
	client  *lease.Client
	rules   rules
	version string
	// snapshotSQL reads every table of schema lease (built on first use)
	snapshotSQL string
}

func newHarness(tb testing.TB) *harness { return newHarnessWith(tb, "") }

// hasCleanup gates a property of lease.cleanup by the installed version's
// rules: true when the version has it; otherwise (0.1.0, through
// PGLEASE_FUZZ_SQL) it checks that the version indeed has no lease.cleanup
// (42883 undefined_function) and returns false, so the property is not
// skipped silently: a version the rules misdescribe fails here.
func (h *harness) hasCleanup(t *testing.T) bool {
	t.Helper()
	if h.rules.hasCleanup {
		return true
	}
	_, err := h.pool.Exec(ctxFor(t), "SELECT lease.cleanup('1 hour')")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42883" {
		t.Fatalf("pg_lease %s: the rules say it has no lease.cleanup, but calling it gave %v (want 42883)", h.version, err)
	}
	t.Logf("pg_lease %s has no lease.cleanup (42883): the property does not apply", h.version)
	return false
}

// newHarnessWith runs pre (SQL, as the superuser that then installs) in the
// new database before pg_lease is installed there.
func newHarnessWith(tb testing.TB, pre string) *harness {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var dsn string
	runPre := func() {
		if pre == "" {
			return
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			tb.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, pre); err != nil {
			tb.Fatalf("before the install: %v", err)
		}
	}
	if file := os.Getenv(EnvSQL); file != "" {
		dsn = pgtest.NewDatabase(tb)
		runPre()
		script := pgtest.ScriptFile(tb, file, EnvSQL)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			tb.Fatal(err)
		}
		_, err = conn.Exec(ctx, "BEGIN; "+script+"; COMMIT")
		conn.Close(ctx)
		if err != nil {
			tb.Fatalf("installing %s=%s as a plain schema: %v", EnvSQL, file, err)
		}
		tb.Logf("pg_lease installed from %s", file)
	} else if pre == "" {
		dsn = pgtest.NewLeaseDatabase(tb)
	} else {
		if err := pgtest.Shared(tb).InstallExtensionFiles(ctx); err != nil {
			tb.Fatal(err)
		}
		dsn = pgtest.NewDatabase(tb)
		runPre()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			tb.Fatal(err)
		}
		_, err = conn.Exec(ctx, "CREATE EXTENSION pg_lease")
		conn.Close(ctx)
		if err != nil {
			tb.Fatal(err)
		}
	}
	pool := pgtest.NewPool(tb, dsn, pgtest.MaxConns(4))
	h := &harness{pool: pool, client: lease.New(pool)}
	var err error
	if err := pool.QueryRow(ctx, "SELECT lease.version()").Scan(&h.version); err != nil {
		tb.Fatal(err)
	}
	if h.rules, err = rulesFor(h.version); err != nil {
		tb.Fatal(err)
	}
	return h
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// snapshot is the whole persistent state: every row of every table of
// schema lease (leases, the epoch floor, and whatever state a later version
// keeps), each table's rows in a fixed order.
func (h *harness) snapshot(t *testing.T) string {
	t.Helper()
	ctx := ctxFor(t)
	if h.snapshotSQL == "" {
		rows, err := h.pool.Query(ctx, `SELECT format($f$SELECT %L || E':\n' || coalesce(string_agg(t::text, E'\n' ORDER BY t::text COLLATE "C"), '') FROM %s t$f$,
			c.oid::regclass::text, c.oid::regclass)
			FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'p') ORDER BY c.relname`)
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(parts) == 0 {
			t.Fatalf("snapshot: %d tables, %v", len(parts), err)
		}
		h.snapshotSQL = "SELECT (" + strings.Join(parts, `) || E'\n' || (`) + ")"
	}
	var s string
	if err := h.pool.QueryRow(ctx, h.snapshotSQL).Scan(&s); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return s
}

// unchanged fails the test when the state differs from before.
func (h *harness) unchanged(t *testing.T, before string, what string) {
	t.Helper()
	if after := h.snapshot(t); after != before {
		t.Fatalf("%s changed the state:\nbefore:\n%s\nafter:\n%s", what, clip(before), clip(after))
	}
}

func clip(s string) string {
	if len(s) > 3000 {
		return s[:3000] + "..."
	}
	return s
}

// reset removes the key's row and keeps the table small, so that every
// input starts from a state it chose (test setup only; through the table,
// as the superuser).
func (h *harness) reset(t *testing.T, keys ...string) {
	t.Helper()
	ctx := ctxFor(t)
	var n int
	if err := h.pool.QueryRow(ctx, "SELECT count(*) FROM lease.leases").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 200 {
		if _, err := h.pool.Exec(ctx, "DELETE FROM lease.leases"); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, k := range keys {
		if !representable(k) {
			continue
		}
		if _, err := h.pool.Exec(ctx, "DELETE FROM lease.leases WHERE key = $1", k); err != nil {
			t.Fatal(err)
		}
	}
}

// pgErr returns the server error in err, if any.
func pgErr(err error) *pgconn.PgError {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg
	}
	return nil
}

// checkInvalid: err is the server's invalid_input (22023, DETAIL naming
// every invalid argument), or the client's own refusal (clientSide allowed:
// no PgError); it matches lease.ErrInvalidInput when through pkg/lease.
func checkInvalid(t *testing.T, err error, names []string, viaClient, clientSideOK bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("invalid input (%s) accepted", strings.Join(names, ", "))
	}
	if viaClient && !errors.Is(err, lease.ErrInvalidInput) {
		t.Fatalf("invalid input (%s): error %v does not match lease.ErrInvalidInput", strings.Join(names, ", "), err)
	}
	pg := pgErr(err)
	if pg == nil {
		if !clientSideOK {
			t.Fatalf("invalid input (%s): %v, want SQLSTATE 22023 from the server", strings.Join(names, ", "), err)
		}
		return
	}
	if pg.Code != "22023" || pg.Message != "invalid_input" || pg.Detail == "" {
		t.Fatalf("invalid input (%s): SQLSTATE %s message %q DETAIL %q, want 22023 invalid_input with a DETAIL",
			strings.Join(names, ", "), pg.Code, pg.Message, pg.Detail)
	}
	for _, n := range names {
		if !strings.Contains(pg.Detail, n) {
			t.Fatalf("invalid input: DETAIL %q does not name %s", pg.Detail, n)
		}
	}
}

// isPayloadOverflow: the known 22023 "payload string too long" of pg_notify.
func isPayloadOverflow(err error) bool {
	pg := pgErr(err)
	return pg != nil && pg.Code == "22023" && pg.Message == "payload string too long"
}

// The helpers below set up the concurrent calls of the property tests:
// a transaction, a second backend, and the wait for that backend to block.

// begin starts a transaction on h's pool, rolled back (if still open) when
// the test ends.
func (h *harness) begin(t *testing.T, ctx context.Context) pgx.Tx {
	t.Helper()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// backend is a connection of h's pool to itself (released when the test
// ends) and the pid of its server backend.
func (h *harness) backend(t *testing.T, ctx context.Context) (*pgxpool.Conn, int) {
	t.Helper()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return conn, pid
}

// connect is a connection of its own to h's database (closed when the test
// ends).
func (h *harness) connect(t *testing.T, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, h.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// listen opens a connection that runs each of pre and then LISTENs on
// channel pg_lease; next returns the payload of its next notification
// (failing the test when none comes within 30 s).
func (h *harness) listen(t *testing.T, ctx context.Context, pre ...string) (next func() string) {
	t.Helper()
	listener := h.connect(t, ctx)
	for _, q := range append(pre, "LISTEN pg_lease") {
		if _, err := listener.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return n.Payload
	}
}

// grant grants key to owner for an hour through h.client, failing the test
// unless it is granted.
func (h *harness) grant(t *testing.T, ctx context.Context, key, owner string) lease.Grant {
	t.Helper()
	g, ok, err := h.client.Acquire(ctx, key, owner, time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	return g
}

// cycle grants key to owner o and releases it, n times, through h.client.
func (h *harness) cycle(t *testing.T, ctx context.Context, key string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		g := h.grant(t, ctx, key, "o")
		if err := h.client.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
	}
}

// waiting reports whether backend pid waits on a lock (with sleep also:
// or sleeps in pg_sleep, a polling wait).
func (h *harness) waiting(t *testing.T, ctx context.Context, pid int, sleep bool) bool {
	t.Helper()
	q := "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1"
	if sleep {
		q = `SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' OR wait_event IS NOT DISTINCT FROM 'PgSleep'
			FROM pg_stat_activity WHERE pid = $1`
	}
	var w bool
	if err := h.pool.QueryRow(ctx, q, pid).Scan(&w); err != nil {
		t.Fatal(err)
	}
	return w
}

// async runs f in a goroutine; its result comes on the channel.
func async[T any](f func() T) <-chan T {
	done := make(chan T, 1)
	go func() { done <- f() }()
	return done
}

// awaitWaiting polls (every 5 ms) until backend pid waits (see waiting),
// or until done delivers first: then it returns that result and true.
func awaitWaiting[T any](t *testing.T, h *harness, ctx context.Context, pid int, sleep bool, done <-chan T) (T, bool) {
	t.Helper()
	for {
		if h.waiting(t, ctx, pid, sleep) {
			var zero T
			return zero, false
		}
		select {
		case r := <-done:
			return r, true
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// mustWait runs f (a call over backend pid) in a goroutine and fails the
// test when f returns before pid waits (see waiting): "<what> did not wait"
// and f's result. Otherwise f's result comes on the channel.
func mustWait[T any](t *testing.T, h *harness, ctx context.Context, pid int, sleep bool, what string, f func() T) <-chan T {
	t.Helper()
	done := async(f)
	if r, finished := awaitWaiting(t, h, ctx, pid, sleep, done); finished {
		t.Fatalf("%s did not wait: %+v", what, r)
	}
	return done
}
