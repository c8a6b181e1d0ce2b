package leaderelection_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// unusedAPIServer is a rest.Config for a loopback address where nothing
// listens: these managers elect their leader through PostgreSQL and
// reconcile events from a Go channel, so they never call a Kubernetes API
// server (a test with a real one lives with the e2e tests).
func unusedAPIServer(t *testing.T) *rest.Config {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return &rest.Config{Host: "http://" + addr}
}

type runningManager struct {
	id     string
	lock   *resourcelock.Lock
	rec    *recordingReconciler
	events chan event.GenericEvent
	cancel context.CancelFunc
	done   chan error
}

func startManager(t *testing.T, dsn, key, id string) *runningManager {
	t.Helper()
	lock, err := resourcelock.New(lease.New(newPool(t, dsn)), resourcelock.Config{Key: key, Identity: id, LeaseDuration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return startManagerOn(t, lock, id, true)
}

// startManagerOn starts a manager electing through lock.
func startManagerOn(t *testing.T, lock *resourcelock.Lock, id string, releaseOnCancel bool) *runningManager {
	t.Helper()
	opts := manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, LeaderElectionReleaseOnCancel: releaseOnCancel}
	mgr, err := pgle.NewManagerForLock(unusedAPIServer(t), opts, lock)
	if err != nil {
		t.Fatal(err)
	}
	m := &runningManager{id: id, lock: lock, rec: &recordingReconciler{}, events: make(chan event.GenericEvent, 100), done: make(chan error, 1)}
	skip := true
	err = builder.TypedControllerManagedBy[reconcile.Request](mgr).
		Named("fenced-" + id).
		WithOptions(controller.TypedOptions[reconcile.Request]{SkipNameValidation: &skip}).
		WatchesRawSource(source.Channel(m.events, &handler.EnqueueRequestForObject{})).
		Complete(pgle.Fenced(lock, reconcile.TypedReconciler[reconcile.Request](m.rec)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { m.done <- mgr.Start(ctx) }()
	t.Cleanup(m.stop)
	return m
}

func (m *runningManager) stop() {
	m.cancel()
	if m.done != nil {
		if err := <-m.done; err != nil {
			panic(fmt.Sprintf("manager %s: %v", m.id, err))
		}
		m.done = nil
	}
}

func (m *runningManager) tokens() []lease.Token {
	m.rec.mu.Lock()
	defer m.rec.mu.Unlock()
	return append([]lease.Token(nil), m.rec.tokens...)
}

// Two controller-runtime managers made by NewManager: only the
// leader's Fenced reconciler runs, every reconcile carries the leader's
// current token, and when the leader stops (LeaderElectionReleaseOnCancel)
// the other manager takes over at the released epoch + 2 and reconciles
// under that token.
func TestManagersElectThroughPostgres(t *testing.T) {
	_, dsn := newClient(t)
	const key = "managers"
	ms := map[string]*runningManager{}
	for _, id := range []string{"a", "b"} {
		ms[id] = startManager(t, dsn, key, id)
	}
	stopFeed := make(chan struct{})
	var feed sync.WaitGroup
	feed.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopFeed:
				return
			case <-tick.C:
			}
			for _, m := range ms {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("obj-%d", i%5)}}
				select {
				case m.events <- event.GenericEvent{Object: cm}:
				default:
				}
			}
		}
	})
	defer func() { close(stopFeed); feed.Wait() }()

	waitLeader := func(what string) *runningManager {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			for _, m := range ms {
				if m.done != nil && len(m.tokens()) > 0 {
					return m
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no reconcile within a minute: %s", what)
		return nil
	}
	leader := waitLeader("first leader")
	first := leader.tokens()[0]
	var other *runningManager
	for _, m := range ms {
		if m != leader {
			other = m
		}
	}
	if n := len(other.tokens()); n != 0 {
		t.Fatalf("the follower %s reconciled %d times", other.id, n)
	}
	stopped := time.Now()
	leader.stop()
	for _, tok := range leader.tokens() {
		if tok != first {
			t.Fatalf("leader %s reconciled under %v and %v", leader.id, first, tok)
		}
	}
	next := waitLeader("takeover")
	if next != other {
		t.Fatalf("after %s stopped, %s reconciled", leader.id, next.id)
	}
	second := next.tokens()[0]
	t.Logf("manager %s (%v) stopped; %s reconciled under %v %v later", leader.id, first, next.id, second,
		time.Since(stopped).Round(time.Millisecond))
	if second.Owner != next.id || second.Epoch != first.Epoch+2 {
		t.Fatalf("successor token %v after %v, want epoch %d (release, then grant)", second, first, first.Epoch+2)
	}
}
