package leaderelection_test

import (
	"context"
	goflag "flag"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// A manager started while PostgreSQL is down waits, and elects once the
// server is back. Building it needs no answer from the server: the pool
// and the listen connection connect when they can.
func TestManagerStartedWhileTheServerIsDown(t *testing.T) {
	ctx := pgtest.Context(t, 3*time.Minute)
	srv := pgtest.New(t)
	dsn := pgtest.NewLeaseDatabaseOn(t, srv)
	// One server without standbys, as its operator would configure it: the
	// first grant after the restart is made at once, above the restart's base (in the
	// default mode 'any', a restart starts a grace of max_ttl).
	if _, err := pgtest.Connect(t, dsn).Exec(ctx, "SELECT lease.configure(promotion => 'synchronous')"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}

	t.Setenv("TEST_DOWN_DSN", dsn)
	fs := goflag.NewFlagSet("manager", goflag.ContinueOnError)
	f := pgle.BindFlags(fs)
	if err := fs.Parse([]string{"-leader-elect", "-leader-elect-resource-lock=pglease",
		"-leader-elect-resource-namespace=ns", "-leader-elect-resource-name=down", "-leader-elect-dsn-env=TEST_DOWN_DSN",
		"-leader-elect-lease-duration=3s", "-leader-elect-renew-deadline=2s", "-leader-elect-retry-period=200ms"}); err != nil {
		t.Fatal(err)
	}
	mgr, err := f.NewManager(unusedAPIServer(t), manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatalf("NewManager while the server is down: %v", err)
	}
	lock := pgle.LockOf(mgr)
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	select {
	case <-mgr.Elected():
		t.Fatal("elected while the server was down")
	case <-time.After(500 * time.Millisecond):
	}

	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-mgr.Elected():
	case <-ctx.Done():
		t.Fatal("the manager did not elect after the server came back")
	}
	// The key's first grant, after the restart: above the restart's base.
	if tok, ok := lock.Token(); !ok || tok.Key != "ns/down" || tok.Epoch != 1<<24+1 {
		t.Fatalf("token %v %v: want ns/down under epoch 2^24+1 (the era's first restart)", tok, ok)
	}
}
