package leaderelection_test

import (
	"context"
	goflag "flag"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/handover"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// --leader-elect-handover and --leader-elect-version: the flags fill the
// Config, bad values are field errors, and a lock built from the Config
// registers its follower as a candidate with that strategy and version,
// ready as ResourceLockOptions.Ready says.
func TestHandoverOption(t *testing.T) {
	fs := goflag.NewFlagSet("x", goflag.ContinueOnError)
	f := pgle.BindFlags(fs)
	if err := fs.Parse([]string{"-leader-elect", "--leader-elect-resource-lock=pglease",
		"--leader-elect-resource-name=op", "--leader-elect-resource-namespace=ns",
		"--leader-elect-handover=newest-version", "--leader-elect-version=v1.2.0"}); err != nil {
		t.Fatal(err)
	}
	c := f.Config
	if c.Handover != "newest-version" || c.Version != "v1.2.0" {
		t.Fatalf("config %+v", c)
	}
	if err := pgle.Validate(&c, field.NewPath("leaderElection")); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	bad := c
	bad.Handover = "fastest"
	if err := pgle.Validate(&bad, field.NewPath("leaderElection")); err == nil || !strings.Contains(err.Error(), "leaderElection.handover") {
		t.Fatalf("handover fastest: %v", err)
	}
	bad = c
	bad.Version = "one.two"
	if err := pgle.Validate(&bad, field.NewPath("leaderElection")); err == nil || !strings.Contains(err.Error(), "leaderElection.version") {
		t.Fatalf("version one.two: %v", err)
	}
	bad = c
	bad.Version = ""
	if err := pgle.Validate(&bad, field.NewPath("leaderElection")); err == nil || !strings.Contains(err.Error(), "leaderElection.version") {
		t.Fatalf("newest-version without a version (a test binary has no module version): %v", err)
	}

	dsn := pgtest.NewLeaseDatabase(t)
	t.Setenv("TEST_LEASE_DSN", dsn)
	c.DSNEnv, c.Identity = "TEST_LEASE_DSN", "me"
	c.LeaseDuration.Duration, c.RenewDeadline.Duration, c.RetryPeriod.Duration = 3*time.Second, 2*time.Second, 200*time.Millisecond
	var ready atomic.Bool
	lock, err := pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{Ready: ready.Load})
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	admin := lease.New(pgtest.NewPool(t, dsn))
	ctx := pgtest.Context(t, time.Minute)
	if _, ok, err := admin.Acquire(ctx, "ns/op", "leader", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	candidate := func() handover.CandidateState {
		t.Helper()
		st, cs, err := handover.Candidates(ctx, admin, "ns/op")
		if err != nil || st != handover.StrategyNewestVersion || len(cs) != 1 || cs[0].Owner != "me" || cs[0].Version != "v1.2.0" {
			t.Fatalf("candidates: %v %+v %v", st, cs, err)
		}
		return cs[0]
	}
	// A candidate's Get waits while another holds the key, and registers
	// the readiness meanwhile.
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() { _, _, err := lock.Get(wctx); waited <- err }()
	pgtest.Eventually(t, time.Minute, "me registered, not ready", func() bool {
		_, cs, err := handover.Candidates(ctx, admin, "ns/op")
		return err == nil && len(cs) == 1
	})
	if cs := candidate(); cs.Ready || cs.Rank != 0 {
		t.Fatalf("not ready yet: %+v", cs)
	}
	ready.Store(true)
	pgtest.Eventually(t, time.Minute, "me registered as ready", func() bool {
		cs := candidate()
		return cs.Ready && cs.Rank == 1
	})
	cancel()
	<-waited
}
