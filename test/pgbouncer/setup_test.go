// Package pgbouncer runs pg_lease behind a real PgBouncer (Debian's
// pgbouncer, started by the tests on loopback) in session and in
// transaction pooling: the lease client, fence.InTx, the Waiter and its
// fallback when notifications cannot pass, pkg/elector in candidate
// processes, client-go's elector on pkg/resourcelock, the CLI, and the
// example programs run as a user runs them. It measures handoff and
// takeover through each mode (t.Log, not assertions).
package pgbouncer

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestThroughPgBouncer runs every part on one server and its two bouncers
// (starting servers is the slow part on a busy machine).
func TestThroughPgBouncer(t *testing.T) {
	s := newSetup(t)
	t.Run("client", func(t *testing.T) { testClient(t, s) })
	t.Run("waiter", func(t *testing.T) { testWaiter(t, s) })
	t.Run("elector", func(t *testing.T) { testElector(t, s) })
	t.Run("clientgo", func(t *testing.T) { testClientGo(t, s) })
	t.Run("cli", func(t *testing.T) { testCLI(t, s) })
	s.checkNoCancelRequests(t)
}

// checkNoCancelRequests fails the test on any cancel request in a bouncer's
// log. Nothing the tests run may send one (PgBouncer 1.18 can crash on
// one): a crash would be luck, a request in the log is not.
func (s *setup) checkNoCancelRequests(t *testing.T) {
	t.Helper()
	for mode, b := range s.bouncers {
		for _, line := range strings.Split(b.Log(), "\n") {
			if strings.Contains(line, "cancel request") {
				t.Errorf("%s pooling: the bouncer saw a cancel request: %s", mode, line)
			}
		}
	}
}

// modes are the pool modes under test. Transaction pooling takes pgx's
// exec mode (no named prepared statements: PgBouncer 1.18 cannot carry
// them across server connections), as docs/operations.md says.
var modes = []struct {
	name  string
	query url.Values
}{
	{"session", nil},
	{"transaction", url.Values{"default_query_exec_mode": {"exec"}}},
}

// setup is a throwaway server with pg_lease in a database of its own and a
// PgBouncer in each pool mode in front of it.
type setup struct {
	srv      *pgtest.Server
	direct   string            // DSN of the database, not through a bouncer
	via      map[string]string // pool mode -> DSN of the database through its bouncer
	bouncers map[string]*pgtest.Bouncer
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	ctx := pgtest.Context(t, 0)
	srv := pgtest.New(t, pgtest.Options{})
	if err := srv.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	s := &setup{srv: srv, via: map[string]string{}, bouncers: map[string]*pgtest.Bouncer{}}
	for _, m := range modes {
		s.bouncers[m.name] = pgtest.NewBouncer(t, srv, m.name)
	}
	s.direct, s.via = s.newDatabase(t, true)
	return s
}

// newDatabase creates a database, with pg_lease in it when ext, and returns
// its DSN and, per pool mode, its DSN through that mode's bouncer.
func (s *setup) newDatabase(t *testing.T, ext bool) (direct string, via map[string]string) {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	_, direct, err := s.srv.NewDatabaseNamed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ext {
		conn, err := pgx.Connect(ctx, direct)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
			t.Fatal(err)
		}
	}
	via = map[string]string{}
	for _, m := range modes {
		u, err := url.Parse(pgtest.BouncerDSN(t, s.bouncers[m.name], direct))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		for k, v := range m.query {
			q[k] = v
		}
		u.RawQuery = q.Encode()
		via[m.name] = u.String()
	}
	return direct, via
}

// forEachMode runs f once per pool mode, with the DSN through that mode's
// bouncer.
func (s *setup) forEachMode(t *testing.T, f func(t *testing.T, mode, dsn string)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m.name, s.via[m.name]) })
	}
}

// newPool is a pool whose queries are not interrupted when their context
// ends (unless still unanswered half a minute later): pgx closes a
// connection whose query it interrupted and sends a cancel request as it
// does, whatever the handler, and PgBouncer 1.18 can crash (FATAL "bad
// client state: 0") when a client closes while its cancel request is under
// way, as docs/operations.md says.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t, dsn, func(c *pgxpool.Config) { noCancelRequests(c.ConnConfig) })
}

func noCancelRequests(c *pgx.ConnConfig) {
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn(), DeadlineDelay: 30 * time.Second}
	}
}

// connConfig is a connection config (a Waiter's) that interrupts as
// newPool's do: the Waiter ends its wait for notifications by its context.
func connConfig(t *testing.T, dsn string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	noCancelRequests(cfg)
	return cfg
}

// directClient is a client that does not go through a bouncer (the other
// party of a test: a holder elsewhere, an operator).
func (s *setup) directClient(t *testing.T) *lease.Client {
	t.Helper()
	return lease.New(newPool(t, s.direct))
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
