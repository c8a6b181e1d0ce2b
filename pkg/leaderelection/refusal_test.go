package leaderelection_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglease/pg_lease/internal/pgtest"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// settled waits until n() is at most want, up to a minute, and returns
// the last count.
func settled(n func() int, want int) int {
	got := n()
	for end := time.Now().Add(time.Minute); got > want && time.Now().Before(end); got = n() {
		time.Sleep(10 * time.Millisecond)
	}
	return got
}

// A pglease Config whose timings break the TTL rule is refused after the
// pool and the listen connection were opened: the refusal closes both
// (no goroutine, no server connection, no row left), whatever the server
// does, and its text holds no password.
func TestNewResourceLockRefusalLeavesNothingOpen(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	admin := pgtest.Connect(t, dsn)
	backends := func() int {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	role, roleDSN := pgtest.NewRole(t, dsn, "refusal")
	rc, err := pgx.ParseConfig(roleDSN)
	if err != nil {
		t.Fatal(err)
	}
	wrong := fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=%s", rc.Host, rc.Port, rc.Database, role, secret)
	base := backends()
	for _, tc := range []struct{ name, dsn string }{
		{"reachable", dsn},
		{"wrong password", wrong},
		{"connection refused", "host=127.0.0.1 port=1 user=u password=" + secret + " connect_timeout=1"},
		{"unreachable host", "host=10.255.255.1 port=5432 user=u password=" + secret + " connect_timeout=30"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REFUSAL_DSN", tc.dsn)
			c := pgle.DefaultConfig()
			c.LeaderElect, c.ResourceLock, c.ResourceName, c.ResourceNamespace = true, "pglease", "op", "ns"
			c.DSNEnv = "REFUSAL_DSN"
			c.RenewDeadline.Duration = 13 * time.Second // + 2s retry: not below 15s - margin
			before := runtime.NumGoroutine()
			l, err := pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{})
			if err == nil {
				l.Close()
				t.Fatal("NewResourceLock accepted a renewDeadline past the TTL")
			}
			refused(t, err, before, backends, base)
			// The same through Flags.NewManager.
			f := &pgle.Flags{Config: c}
			before = runtime.NumGoroutine()
			if _, err := f.NewManager(&rest.Config{Host: "http://127.0.0.1:1"}, manager.Options{LeaderElection: true}); err == nil {
				t.Fatal("NewManager accepted a renewDeadline past the TTL")
			} else {
				refused(t, err, before, backends, base)
			}
			s, err := lease.New(pgtest.NewPool(t, dsn)).Inspect(context.Background(), "ns/op")
			if err != nil || s.Exists {
				t.Errorf("key after the refusal: %+v, %v; want no row", s, err)
			}
		})
	}
}

// refused checks a refusal of renewDeadline: named, no password in it, and
// no more goroutines than before nor server connections than base.
func refused(t *testing.T, err error, before int, backends func() int, base int) {
	t.Helper()
	if !errors.Is(err, pgle.ErrInvalidConfig) || !strings.Contains(err.Error(), "renewDeadline") {
		t.Errorf("error %v, want ErrInvalidConfig naming renewDeadline", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error prints the password: %v", err)
	}
	if n := settled(runtime.NumGoroutine, before); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the refusal, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	if n := settled(backends, base); n != base {
		t.Errorf("%d server connections left open, %d before", n, base)
	}
}

// A Config with a bad identity and timings past the TTL: the refusal
// names both.
func TestNewResourceLockKeepsEveryComplaint(t *testing.T) {
	t.Setenv("REFUSAL_DSN", "host=127.0.0.1 port=1 user=u connect_timeout=1")
	c := pgle.DefaultConfig()
	c.LeaderElect, c.ResourceLock, c.ResourceName, c.ResourceNamespace = true, "pglease", "op", "ns"
	c.DSNEnv, c.Identity = "REFUSAL_DSN", "bad\x01identity"
	c.RenewDeadline.Duration = 13 * time.Second
	l, err := pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{})
	if err == nil {
		l.Close()
		t.Fatal("NewResourceLock accepted it")
	}
	for _, w := range []string{"renewDeadline", "identity", "control characters"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if !errors.Is(err, pgle.ErrInvalidConfig) || !errors.Is(err, lease.ErrInvalidInput) {
		t.Errorf("error %v, want ErrInvalidConfig and lease.ErrInvalidInput", err)
	}
}
