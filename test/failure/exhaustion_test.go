package failure

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgerr"
	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Resource exhaustion fails closed with nothing changed: no connection slot
// left, statement_timeout during a blocking acquire, lock_timeout behind a
// transaction that holds the key's row lock (lease.fence).
func TestResourceExhaustionFailsClosed(t *testing.T) {
	e := newEnv(t, pgtest.Options{Settings: map[string]string{
		"max_connections":                "6",
		"superuser_reserved_connections": "2",
	}})
	ctx := pgtest.Context(t, 2*time.Minute)
	if err := e.srv.CreateRole(ctx, "app", "LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	appDSN := pgtest.WithUser(e.dsn, "app")
	admin := e.connect(t) // superuser: a reserved slot is always there for it
	// appConn connects as app, waiting for a slot: backends of connections
	// closed by an earlier step free theirs only once they have exited.
	appConn := func(t *testing.T) *pgx.Conn {
		t.Helper()
		var conn *pgx.Conn
		pgtest.Eventually(t, 10*time.Second, "a free connection slot", func() bool {
			c, err := pgx.Connect(ctx, appDSN)
			if err != nil && pgerr.Code(err) != "53300" {
				t.Fatal(err)
			}
			conn = c
			return err == nil
		})
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	unchanged := func(t *testing.T, before []string, what string) {
		t.Helper()
		if after := rawRows(t, admin); !slices.Equal(before, after) {
			t.Fatalf("state changed by %s:\nbefore:\n  %s\nafter:\n  %s", what,
				strings.Join(before, "\n  "), strings.Join(after, "\n  "))
		}
	}

	t.Run("connections", func(t *testing.T) {
		holder := lease.New(appConn(t))
		g := mustAcquire(t, holder, "k", "holder", time.Hour)
		// Take every slot left to app.
		var fillers []*pgx.Conn
		var refused error
		for i := 0; i < 10 && refused == nil; i++ {
			c, err := pgx.Connect(ctx, appDSN)
			if err != nil {
				refused = err
				break
			}
			fillers = append(fillers, c)
		}
		defer func() {
			for _, c := range fillers {
				_ = c.Close(context.Background())
			}
		}()
		if pgerr.Code(refused) != "53300" {
			t.Fatalf("after %d connections: %v, want SQLSTATE 53300", len(fillers), refused)
		}
		before := rawRows(t, admin)
		// A worker that wants to act under a grant of "job".
		mayAct := func(acquired bool, err error) bool {
			if breakIs(t, "guard_fail_open") {
				return acquired || err != nil
			}
			return err == nil && acquired
		}
		acquired, err := func() (bool, error) {
			conn, err := pgx.Connect(ctx, appDSN)
			if err != nil {
				return false, err
			}
			defer conn.Close(ctx)
			_, ok, err := lease.New(conn).Acquire(ctx, "job", "worker", time.Hour)
			return ok, err
		}()
		if pgerr.Code(err) != "53300" {
			t.Fatalf("worker with no slot left: %v, want SQLSTATE 53300 (too_many_connections)", err)
		}
		if mayAct(acquired, err) {
			t.Fatalf("the worker would act without a grant after: %v", err)
		}
		t.Logf("worker refused: %v", err)
		unchanged(t, before, "a refused connection")
		// Established sessions keep working; once a slot frees, so does a
		// new one, with no repair.
		if _, err := holder.Renew(ctx, g.Token, time.Hour); err != nil {
			t.Fatalf("holder's renew with the slots exhausted: %v", err)
		}
		pid := fillers[0].PgConn().PID()
		_ = fillers[0].Close(ctx)
		fillers = fillers[1:]
		backendGone(t, admin, pid)
		w := lease.New(appConn(t))
		if g, ok, err := w.Acquire(ctx, "job", "worker", time.Hour); err != nil || !ok || g.Epoch != 1 {
			t.Fatalf("worker's acquire once a slot is free: %v ok=%t err=%v", g.Token, ok, err)
		}
	})

	t.Run("statement_timeout", func(t *testing.T) {
		holder := lease.New(appConn(t))
		g := mustAcquire(t, holder, "st", "holder", 1500*time.Millisecond)
		wconn := appConn(t)
		if _, err := wconn.Exec(ctx, `SET statement_timeout = '300ms'`); err != nil {
			t.Fatal(err)
		}
		before := rawRows(t, admin)
		start := time.Now()
		wg, err := lease.New(wconn).AcquireWait(ctx, "st", "waiter", time.Minute, 5*time.Second)
		took := time.Since(start)
		if err == nil {
			t.Fatalf("blocking acquire under statement_timeout 300ms returned a grant after %v: %v", took, wg.Token)
		}
		if pgerr.Code(err) != "57014" || pgerr.Message(err) != "canceling statement due to statement timeout" || errors.Is(err, lease.ErrWaitTimeout) {
			t.Fatalf("blocking acquire under statement_timeout: %v (code %s), want 57014 canceling statement due to statement timeout, not the lease's own timeout",
				err, pgerr.Code(err))
		}
		t.Logf("cancelled after %v: %v", took.Round(time.Millisecond), err)
		unchanged(t, before, "a cancelled blocking acquire")
		// Nothing was left to grant it later: once the holder's grant
		// lapses the key is free, not the waiter's.
		s := pgtest.WaitLapsed(t, lease.New(admin), "st", 30*time.Second)
		if s.Epoch != g.Epoch {
			t.Fatalf("after the holder's expiry: %s", stateString(s))
		}
		// The lease's own wait bound is a different error.
		mustAcquire(t, holder, "st2", "holder", time.Hour)
		w2 := lease.New(appConn(t))
		if _, err := w2.AcquireWait(ctx, "st2", "waiter", time.Minute, 200*time.Millisecond); !errors.Is(err, lease.ErrWaitTimeout) || pgerr.Message(err) != "timeout" {
			t.Fatalf("blocking acquire past its wait bound: %v, want the lease's timeout (57014 \"timeout\")", err)
		}
	})

	t.Run("lock_timeout", func(t *testing.T) {
		hconn := appConn(t)
		holder := lease.New(hconn)
		g := mustAcquire(t, holder, "lk", "holder", time.Hour)
		// A fenced write of the holder's, still open: it keeps the row
		// share-locked.
		fconn := appConn(t)
		tx, err := fconn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := lease.Fence(ctx, tx, g.Token); err != nil {
			t.Fatal(err)
		}
		if _, err := hconn.Exec(ctx, `SET lock_timeout = '200ms'`); err != nil {
			t.Fatal(err)
		}
		before := rawRows(t, admin)
		if rg, err := holder.Renew(ctx, g.Token, 50*time.Minute); pgerr.Code(err) != "55P03" {
			t.Fatalf("renew behind the fence's row lock: %v %v, want SQLSTATE 55P03 (lock_not_available)", rg.Token, err)
		} else {
			t.Logf("renew: %v", err)
		}
		if err := holder.Release(ctx, g.Token); pgerr.Code(err) != "55P03" {
			t.Fatalf("release behind the fence's row lock: %v, want SQLSTATE 55P03", err)
		}
		if _, ok, err := lease.New(appConn(t)).Acquire(ctx, "lk", "other", time.Minute); err != nil || ok {
			t.Fatalf("another owner's acquire while held: ok=%t err=%v", ok, err)
		}
		unchanged(t, before, "operations that hit lock_timeout")
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Renew(ctx, g.Token, time.Hour); err != nil {
			t.Fatalf("renew once the fence's transaction ended: %v", err)
		}
	})
}
