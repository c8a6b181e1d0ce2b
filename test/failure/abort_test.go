package failure

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgerr"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Operation transaction aborts (ROLLBACK, an error later in the
// transaction, or the client dying mid-transaction): acquire, renew and
// release roll back with it, the state before stands, and it stays usable:
// another session can take what was free, the holder keeps what it held.
func TestOperationTransactionAborted(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	ctx := pgtest.Context(t, 2*time.Minute)
	admin := e.connect(t)
	setupConn := e.connect(t)
	setup := lease.New(setupConn)
	holder := e.client(t)
	other := e.client(t)

	held := map[string]lease.Grant{}
	for _, k := range []string{"h-renew", "h-release", "h-error", "h-crash"} {
		held[k] = mustAcquire(t, holder, k, "a", 30*time.Minute)
	}
	mustRelease(t, setup, mustAcquire(t, setup, "free", "a", 30*time.Minute))
	mustAcquire(t, setup, "lapsed", "a", 200*time.Millisecond)
	pgtest.WaitLapsed(t, setup, "lapsed", 30*time.Second)
	// The setup session ends (and with it anything it kept beyond its
	// transactions): what follows sees only the table's state.
	setupPID := setupConn.PgConn().PID()
	if err := setupConn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	backendGone(t, admin, setupPID)

	cases := []struct {
		name string
		ops  func(t *testing.T, tx pgx.Tx)
		end  string // rollback, error, disconnect
		then func(t *testing.T)
	}{{
		name: "acquire/rollback",
		ops: func(t *testing.T, tx pgx.Tx) {
			c := lease.New(tx)
			for _, k := range []string{"never", "free", "lapsed"} {
				g := mustAcquire(t, c, k, "x", 30*time.Minute)
				if s := inspect(t, c, k); !s.Held || s.Owner != "x" || s.Epoch != g.Epoch {
					t.Fatalf("inside the transaction: %s", stateString(s))
				}
			}
		},
		end: "rollback",
		then: func(t *testing.T) {
			if s := inspect(t, other, "never"); s.Exists {
				t.Fatalf("rolled-back first grant left a row: %s", stateString(s))
			}
			// What was free or lapsed is still acquirable, by another session.
			for k, want := range map[string]int64{"never": 1, "free": 3, "lapsed": 2} {
				g, ok, err := other.Acquire(pgtest.Context(t, time.Minute), k, "y", 30*time.Minute)
				if err != nil || !ok || g.Epoch != want {
					t.Fatalf("acquire of %s by another session after the rollback: %v ok=%t err=%v, want epoch %d",
						k, g.Token, ok, err, want)
				}
			}
		},
	}, {
		name: "renew/rollback",
		ops: func(t *testing.T, tx pgx.Tx) {
			if _, err := lease.New(tx).Renew(pgtest.Context(t, time.Minute), held["h-renew"].Token, time.Hour); err != nil {
				t.Fatal(err)
			}
		},
		end: "rollback",
	}, {
		name: "release/rollback",
		ops: func(t *testing.T, tx pgx.Tx) {
			c := lease.New(tx)
			mustRelease(t, c, held["h-release"])
			if s := inspect(t, c, "h-release"); s.Held {
				t.Fatalf("inside the transaction after release: %s", stateString(s))
			}
		},
		end: "rollback",
		then: func(t *testing.T) {
			if _, ok, err := other.Acquire(pgtest.Context(t, time.Minute), "h-release", "y", 30*time.Minute); err != nil || ok {
				t.Fatalf("another owner acquired h-release after the rolled-back release: ok=%t err=%v", ok, err)
			}
			if _, err := holder.Renew(pgtest.Context(t, time.Minute), held["h-release"].Token, 30*time.Minute); err != nil {
				t.Fatalf("holder's renew after the rolled-back release: %v", err)
			}
		},
	}, {
		name: "acquire+release/error",
		ops: func(t *testing.T, tx pgx.Tx) {
			c := lease.New(tx)
			mustAcquire(t, c, "never-err", "x", 30*time.Minute)
			mustRelease(t, c, held["h-error"])
			if _, err := tx.Exec(pgtest.Context(t, time.Minute), `SELECT 1/0`); pgerr.Code(err) != "22012" {
				t.Fatalf("SELECT 1/0: %v", err)
			}
		},
		end: "error",
		then: func(t *testing.T) {
			if s := inspect(t, other, "never-err"); s.Exists {
				t.Fatalf("first grant of a failed transaction left a row: %s", stateString(s))
			}
		},
	}, {
		name: "acquire+renew/client-dies",
		ops: func(t *testing.T, tx pgx.Tx) {
			c := lease.New(tx)
			mustAcquire(t, c, "never-crash", "x", 30*time.Minute)
			if _, err := c.Renew(pgtest.Context(t, time.Minute), held["h-crash"].Token, time.Hour); err != nil {
				t.Fatal(err)
			}
		},
		end: "disconnect",
		then: func(t *testing.T) {
			if s := inspect(t, other, "never-crash"); s.Exists {
				t.Fatalf("first grant of a dead client's transaction left a row: %s", stateString(s))
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := rawRows(t, admin)
			conn := e.connect(t)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tc.ops(t, tx)
			switch tc.end {
			case "rollback":
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			case "error":
				if err := tx.Commit(ctx); err == nil {
					t.Fatal("COMMIT of a failed transaction succeeded")
				}
			case "disconnect":
				pid := conn.PgConn().PID()
				// The client dies: its socket closes with the transaction open.
				if err := conn.PgConn().Conn().Close(); err != nil {
					t.Fatal(err)
				}
				backendGone(t, admin, pid)
				_ = conn.Close(context.Background())
			}
			after := rawRows(t, admin)
			if !slices.Equal(before, after) {
				t.Fatalf("state changed by an aborted transaction:\nbefore:\n  %s\nafter:\n  %s",
					strings.Join(before, "\n  "), strings.Join(after, "\n  "))
			}
			if tc.then != nil {
				tc.then(t)
			}
		})
	}
}
