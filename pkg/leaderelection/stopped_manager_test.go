package leaderelection_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// firstToken feeds m events until its Fenced reconciler has run once, and
// returns that reconcile's token.
func firstToken(t *testing.T, m *runningManager) lease.Token {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "obj"}}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if toks := m.tokens(); len(toks) > 0 {
			return toks[0]
		}
		select {
		case m.events <- event.GenericEvent{Object: cm}:
		default:
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("manager %s: no reconcile within a minute", m.id)
	return lease.Token{}
}

// A manager that stops without releasing (LeaderElectionReleaseOnCancel
// false, kubebuilder's default) still shuts down cleanly; its lock's term
// ends when client-go stops leading, and the grant is left to its TTL. A
// manager started again on the same lock reconciles under a new epoch.
func TestManagerRestartOnTheSameLockWithoutRelease(t *testing.T) {
	client, dsn := newClient(t)
	ctx := context.Background()
	lock, err := resourcelock.New(lease.New(newPool(t, dsn)), resourcelock.Config{Key: "restart", Identity: "a", LeaseDuration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := startManagerOn(t, lock, "a", false)
	first := firstToken(t, m)
	tctx, cancel, err := lock.TokenContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	m.stop() // panics if Start returned an error
	if cause := context.Cause(tctx); !errors.Is(cause, resourcelock.ErrStoppedLeading) {
		t.Fatalf("after the manager stopped: the term's context: %v, want ErrStoppedLeading", cause)
	}
	if s, err := client.Inspect(ctx, "restart"); err != nil || !s.Held || s.Epoch != first.Epoch {
		t.Fatalf("no release on cancel: %+v, %v, want epoch %d still held", s, err, first.Epoch)
	}
	m2 := startManagerOn(t, lock, "a", false)
	second := firstToken(t, m2)
	if second.Epoch <= first.Epoch {
		t.Fatalf("the restarted manager reconciled under %v after %v", second, first)
	}
}
