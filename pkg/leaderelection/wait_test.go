package leaderelection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglease/pg_lease/internal/pgtest"
	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// newDSNLock builds, with NewResourceLock, a pglease lock for ns/op on a
// database of its own whose DSN it reads from the environment (Config.DSNEnv), as a
// component started with --leader-elect-resource-lock=pglease does; the lock
// is closed when the test ends.
func newDSNLock(t *testing.T, identity string) (string, *pgle.ResourceLock) {
	t.Helper()
	dsn := pgtest.NewLeaseDatabase(t)
	t.Setenv("DSN_LOCK_LEASE_DSN", dsn)
	c := pgle.DefaultConfig()
	c.LeaderElect, c.ResourceLock, c.ResourceName, c.ResourceNamespace = true, "pglease", "op", "ns"
	c.DSNEnv = "DSN_LOCK_LEASE_DSN"
	c.Identity = identity
	lock, err := pgle.NewResourceLock(context.Background(), c, pgle.ResourceLockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lock.Close)
	return dsn, lock
}

// NewResourceLock("pglease") builds a lock whose follower Get waits for news: a
// standby's Get, issued while another candidate holds the key, returns
// only after that candidate released it, with the key free (without the
// waiter it returns at once, naming the holder). Close stops the listener.
func TestNewPgLeaseFollowerWaits(t *testing.T) {
	dsn, lock := newDSNLock(t, "standby")

	leader, err := resourcelock.New(lease.New(newPool(t, dsn)), resourcelock.Config{Key: "ns/op", Identity: "leader"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := leader.Create(ctx, rl.LeaderElectionRecord{HolderIdentity: "leader"}); err != nil {
		t.Fatal(err)
	}
	if r, _, err := lock.Get(ctx); err != nil || r.HolderIdentity != "leader" {
		t.Fatalf("first Get: %+v %v", r, err)
	}
	type got struct {
		holder string
		err    error
	}
	res := make(chan got, 1)
	go func() {
		r, _, err := lock.Get(ctx)
		if err != nil {
			res <- got{err: err}
			return
		}
		res <- got{holder: r.HolderIdentity}
	}()
	time.Sleep(500 * time.Millisecond) // the Get is waiting (or, broken, has returned)
	if err := leader.Update(ctx, rl.LeaderElectionRecord{}); err != nil {
		t.Fatalf("release: %v", err)
	}
	releasedAt := time.Now()
	g := <-res
	t.Logf("Get returned %v after the release", time.Since(releasedAt))
	if g.err != nil || g.holder != "" {
		t.Fatalf("the standby's second Get returned holder %q (err %v): want it to wait for the release and report the key free", g.holder, g.err)
	}
}

// The pool NewResourceLock opens from the DSN warms each connection (lease.WarmConn):
// the client's calls are already prepared on it before the first handoff.
func TestNewPgLeasePoolIsWarm(t *testing.T) {
	_, lock := newDSNLock(t, "warm")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgle.PoolOf(lock).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%lease.acquire(%' OR statement LIKE '%lease.release(%'`, pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("a connection of the lock's own pool has %d of acquire and release prepared, want 2 (warmed by lease.WarmConn)", n)
	}
}
