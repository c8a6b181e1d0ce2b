package shard_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/shard"
)

// TestControllerRuntimeGlue: the Source enqueues the objects of every shard
// the replica acquires (and only those), the Predicate passes only objects
// of owned shards, and the Reconciler runs the inner one with the shard's
// token for owned shards only.
func TestControllerRuntimeGlue(t *testing.T) {
	ctx := pgtest.Context(t, 0)
	pool := pgtest.NewLeasePool(t)
	const n = 8
	var objs []client.Object
	for i := range 40 {
		objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("cm-%d", i)}})
	}
	reader := fake.NewClientBuilder().WithObjects(objs...).Build()

	// Another member holds half of the shards: it never runs, so its
	// shards stay assigned to it while its member key is held.
	lc := lease.New(pool)
	other := "zz-other"
	if _, ok, err := lc.Acquire(ctx, shard.MemberKey("ctl", other), other, time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	mine := shard.Assign(n, []string{"me", other})
	for s, o := range mine {
		if o == other {
			if _, ok, err := lc.Acquire(ctx, shard.Key("ctl", s), other, time.Minute); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
	}

	r, err := shard.New(shard.Config{Client: lc, Controller: "ctl", Shards: n, Identity: "me", TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer queue.ShutDown()
	if err := r.Source(reader, &corev1.ConfigMapList{}).Start(ctx, queue); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Start(rctx) }()
	defer func() { cancel(); <-done }()

	var want []string
	for _, o := range objs {
		if mine[shard.Of("ns", o.GetName(), n)] == "me" {
			want = append(want, "ns/"+o.GetName())
		}
	}
	sort.Strings(want)
	deadline := time.Now().Add(time.Minute)
	for queue.Len() < len(want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // any extra enqueue would show here
	var got []string
	for queue.Len() > 0 {
		req, _ := queue.Get()
		got = append(got, req.String())
		queue.Done(req)
	}
	sort.Strings(got)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("enqueued %v, want the objects of the owned shards %v", got, want)
	}
	if r.NeedLeaderElection() {
		t.Error("NeedLeaderElection: want false")
	}

	pred := r.Predicate()
	inner := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		tok, ok := lease.TokenFromContext(ctx)
		s := shard.Of(req.Namespace, req.Name, n)
		if !ok || tok.Key != shard.Key("ctl", s) || tok.Owner != r.Owner() {
			t.Errorf("%v: reconciled with token %v (%v)", req, tok, ok)
		}
		return reconcile.Result{Requeue: true}, nil
	})
	rec := r.Reconciler(inner)
	for _, o := range objs {
		owned := mine[shard.Of("ns", o.GetName(), n)] == "me"
		if pred.Create(event.CreateEvent{Object: o}) != owned {
			t.Errorf("%s: predicate %v, owned %v", o.GetName(), !owned, owned)
		}
		res, err := rec.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: o.GetName()}})
		if err != nil || res.Requeue != owned {
			t.Errorf("%s: reconcile ran %v (err %v), owned %v", o.GetName(), res.Requeue, err, owned)
		}
	}
}
