package leaderelection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pgle "github.com/pglease/pg_lease/pkg/leaderelection"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/apimachinery/pkg/types"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// errStale is what a reconciler typically returns, as a terminal error, when
// its fenced write was rejected: retrying the same write under the same
// (ended) epoch cannot succeed.
var errStale = errors.New("stale write rejected by the fencing guard")

// terminalWhenEpochEnds returns reconcile.TerminalError when the epoch of its
// context ends during the call, and succeeds otherwise; it records the token
// of every call and reports each on calls.
type terminalWhenEpochEnds struct {
	mu     sync.Mutex
	tokens []lease.Token
	calls  chan lease.Token
}

func (r *terminalWhenEpochEnds) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	tok, ok := lease.TokenFromContext(ctx)
	if !ok {
		return reconcile.Result{}, errors.New("no token in the context")
	}
	r.mu.Lock()
	first := len(r.tokens) == 0
	r.tokens = append(r.tokens, tok)
	r.mu.Unlock()
	r.calls <- tok
	if first {
		<-ctx.Done() // the epoch ends while the write is in flight
		return reconcile.Result{}, reconcile.TerminalError(fmt.Errorf("%w: %w", errStale, context.Cause(ctx)))
	}
	return reconcile.Result{}, nil
}

// TestFencedEpochEndedIsNotTerminal: a reconcile whose epoch ended is run
// again under the next epoch even when the wrapped reconciler answered with
// a terminal error (which, for its own epoch, it rightly is). The error
// Fenced returns is ErrEpochEnded, keeps the inner error's text and is not a
// reconcile.TerminalError, which controller-runtime would drop without a
// requeue (internal/controller.reconcileHandler: errors.Is(err,
// reconcile.TerminalError(nil)) → no AddRateLimited). Checked on the error
// and through a real controller-runtime controller.
func TestFencedEpochEndedIsNotTerminal(t *testing.T) {
	client, _ := newClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lock, err := resourcelock.New(client, resourcelock.Config{Key: "k", Identity: "a", LeaseDuration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Create(ctx, rl.LeaderElectionRecord{HolderIdentity: "a"}); err != nil {
		t.Fatal(err)
	}
	// reacquire takes the next grant after a release, as client-go's elector
	// does (Get, then Update naming this identity).
	reacquire := func() {
		t.Helper()
		if _, _, err := lock.Get(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lock.Update(ctx, rl.LeaderElectionRecord{HolderIdentity: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	inner := &terminalWhenEpochEnds{calls: make(chan lease.Token, 16)}
	fenced := pgle.Fenced(lock, reconcile.TypedReconciler[reconcile.Request](inner))

	// 1. The error itself.
	errc := make(chan error, 1)
	go func() {
		_, err := fenced.Reconcile(ctx, reconcile.Request{})
		errc <- err
	}()
	if tok := <-inner.calls; tok.Epoch != 1 {
		t.Fatalf("first call under %v, want epoch 1", tok)
	}
	if err := lock.Update(ctx, rl.LeaderElectionRecord{}); err != nil { // release: epoch 1 ends
		t.Fatal(err)
	}
	err = <-errc
	if !errors.Is(err, pgle.ErrEpochEnded) {
		t.Fatalf("error %v: want ErrEpochEnded", err)
	}
	if errors.Is(err, reconcile.TerminalError(nil)) {
		t.Fatalf("error %v is a reconcile.TerminalError: controller-runtime would drop the request", err)
	}
	if !strings.Contains(err.Error(), errStale.Error()) {
		t.Fatalf("error %q does not keep the inner error's text %q", err, errStale)
	}

	// 2. Through a controller: the request comes back under the next epoch.
	inner.mu.Lock()
	inner.tokens = nil
	inner.mu.Unlock()
	reacquire() // epoch 3
	skip := true
	c, err := controller.NewTypedUnmanaged("fenced-terminal", controller.TypedOptions[reconcile.Request]{
		Reconciler:         fenced,
		SkipNameValidation: &skip,
	})
	if err != nil {
		t.Fatal(err)
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "thing"}}
	if err := c.Watch(source.TypedFunc[reconcile.Request](func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(req)
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	}()
	if tok := <-inner.calls; tok.Epoch != 3 {
		t.Fatalf("first controller call under %v, want epoch 3", tok)
	}
	if err := lock.Update(ctx, rl.LeaderElectionRecord{}); err != nil { // release: epoch 3 ends mid-reconcile
		t.Fatal(err)
	}
	reacquire() // epoch 5
	// The controller retries with backoff (resourcelock.ErrNotHolding in between is possible);
	// the bound only ends a test whose request was dropped.
	select {
	case tok := <-inner.calls:
		if tok.Epoch != 5 {
			t.Fatalf("request re-run under %v, want epoch 5", tok)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request was not run again after its epoch ended (dropped as terminal)")
	}
}
