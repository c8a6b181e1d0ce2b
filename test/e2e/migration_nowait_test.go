package e2e

import (
	"context"
	"testing"
	"time"

	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/component-base/config"
)

// TestMigrationLockGetDoesNotWait: the "leases+pglease" lock that
// leaderelection.NewResourceLock builds never waits in Get. An old pod
// ("leases" only)
// holds the Lease and nobody touches the pg_lease key: a new pod's elector
// must still read the Lease every RetryPeriod (that is how it learns the
// old pod is gone). A pg_lease half that waited for news of its key would
// hold every Get after the first until the key changed (never, here).
func TestMigrationLockGetDoesNotWait(t *testing.T) {
	cfg := StartControlPlane(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOWAIT_LEASE_DSN", dropinLeaseDB(t))
	const ns, name = "default", "nowait"
	old, err := rl.New(rl.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(), rl.ResourceLockConfig{Identity: "old"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := old.Create(ctx, rl.LeaderElectionRecord{HolderIdentity: "old", LeaseDurationSeconds: 15}); err != nil {
		t.Fatal(err)
	}
	// controller-runtime's default timings; the resource lock by its name.
	c := pgle.Config{LeaderElectionConfiguration: config.LeaderElectionConfiguration{
		LeaderElect: true, ResourceLock: "leases+pglease", ResourceName: name, ResourceNamespace: ns,
		LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewDeadline: metav1.Duration{Duration: 10 * time.Second},
		RetryPeriod: metav1.Duration{Duration: 2 * time.Second},
	}}
	c.DSNEnv, c.Identity = "NOWAIT_LEASE_DSN", "new"
	lock, err := pgle.NewResourceLock(ctx, c, pgle.ResourceLockOptions{KubeConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	for i := range 3 {
		// Each Get gets two RetryPeriods: client-go's acquire loop calls it
		// once per RetryPeriod. A waiting Get would end with the context.
		gctx, gcancel := context.WithTimeout(ctx, 2*c.RetryPeriod.Duration)
		r, _, err := lock.Get(gctx)
		gcancel()
		if err != nil {
			t.Fatalf("Get %d: %v (the pg_lease half waited for news of a key nobody touches?)", i+1, err)
		}
		if r.HolderIdentity != "old" {
			t.Fatalf("Get %d: holder %q, want old", i+1, r.HolderIdentity)
		}
	}
}
