package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestMigrationLockContract walks leaderelection.MigrationLock through the
// states of a migration against a real kube-apiserver and PostgreSQL, call
// by call: whose name Get reports (a candidate never sees itself as holder
// unless it holds both), that the raw record changes when either lock is
// written, the order of acquisition (Lease first) and of release (key
// first).
func TestMigrationLockContract(t *testing.T) {
	cfg := StartControlPlane(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	leases := lease.New(newPool(t, dropinLeaseDB(t)))
	ctx := context.Background()
	const ns, name, key = "default", "contract", "default/contract"
	leaseLock := func(id string) rl.Interface {
		l, err := rl.New(rl.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(), rl.ResourceLockConfig{Identity: id})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	pgLock := func(id string) *resourcelock.Lock {
		l, err := resourcelock.New(leases, resourcelock.Config{Key: key, Identity: id, LeaseDuration: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	rec := func(id string) rl.LeaderElectionRecord {
		return rl.LeaderElectionRecord{HolderIdentity: id, LeaseDurationSeconds: 30}
	}
	released := rl.LeaderElectionRecord{LeaseDurationSeconds: 1} // what client-go's release writes
	old := leaseLock("old")
	newPg := pgLock("new")
	mig, err := pgle.NewMigrationLock(leaseLock("new"), newPg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgle.NewMigrationLock(leaseLock("x"), newPg); err == nil {
		t.Fatal("NewMigrationLock accepted two identities")
	}
	get := func(want string) []byte {
		t.Helper()
		r, raw, err := mig.Get(ctx)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if r.HolderIdentity != want {
			t.Fatalf("Get reports holder %q, want %q", r.HolderIdentity, want)
		}
		return raw
	}

	// No Lease yet: NotFound, so the elector Creates.
	if _, _, err := mig.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Get before any Lease: %v, want NotFound", err)
	}
	// An old pod holds the Lease; the key was never leased.
	if err := old.Create(ctx, rec("old")); err != nil {
		t.Fatal(err)
	}
	raw1 := get("old")
	// The old pod renews: the raw record changes.
	if _, _, err := old.Get(ctx); err != nil {
		t.Fatal(err)
	}
	r := rec("old")
	r.RenewTime.Time = time.Now().Add(time.Second)
	if err := old.Update(ctx, r); err != nil {
		t.Fatal(err)
	}
	if raw2 := get("old"); bytes.Equal(raw1, raw2) {
		t.Fatal("the raw record did not change when the Lease was renewed")
	}

	// A stale pg_lease holder K holds the key. "new" takes the Lease (the
	// elector does so once the old pod's record went stale) but cannot get
	// the key: the Update fails, and Get names K, not "new".
	other := pgLock("k")
	if err := other.Create(ctx, rec("k")); err != nil {
		t.Fatal(err)
	}
	rawK := get("old")
	if err := mig.Update(ctx, rec("new")); err == nil {
		t.Fatal("Update succeeded with the key held by another")
	}
	l, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "new" {
		t.Fatalf("the Lease after the failed Update: %+v %v (want held by new: Lease first)", l, err)
	}
	if _, ok := newPg.Token(); ok {
		t.Fatal("the key was granted")
	}
	if rawN := get("k"); bytes.Equal(rawK, rawN) {
		t.Fatal("the raw record did not change when the Lease was taken")
	}

	// K lets go: "new" sees itself (key free), and its Update takes the key.
	if err := other.Update(ctx, rl.LeaderElectionRecord{}); err != nil {
		t.Fatal(err)
	}
	get("new")
	if err := mig.Update(ctx, rec("new")); err != nil {
		t.Fatalf("Update with the key free: %v", err)
	}
	tok, ok := newPg.Token()
	if kTok := (lease.Token{Key: key, Owner: "k", Epoch: 1}); !ok || tok.Epoch <= kTok.Epoch {
		t.Fatalf("token %v %v, want an epoch above K's %d", tok, ok, kTok.Epoch)
	}
	get("new")

	// Release: the key first, then the Lease.
	if err := mig.Update(ctx, released); err != nil {
		t.Fatalf("release: %v", err)
	}
	s, err := leases.Inspect(ctx, key)
	if err != nil || s.Held {
		t.Fatalf("key after release: %+v %v", s, err)
	}
	get("")
	// A second release (client-go retries a release after a Conflict): the
	// key is no longer held, the Lease is still released, no error.
	if _, _, err := mig.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mig.Update(ctx, released); err != nil {
		t.Fatalf("second release: %v", err)
	}
}
