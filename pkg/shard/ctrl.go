package shard

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// A Sharder is a controller-runtime Runnable that runs on every replica,
// leader or not: add it with mgr.Add.
var (
	_ manager.Runnable               = (*Sharder)(nil)
	_ manager.LeaderElectionRunnable = (*Sharder)(nil)
)

// Start is Run (manager.Runnable).
func (r *Sharder) Start(ctx context.Context) error { return r.Run(ctx) }

// NeedLeaderElection is false: every replica runs its Sharder.
func (r *Sharder) NeedLeaderElection() bool { return false }

// Predicate passes the events of objects in the shards this replica owns
// now (builder.WithEventFilter). Objects of a shard acquired later are
// enqueued again by Source.
func (r *Sharder) Predicate() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return r.Owns(r.Of(o.GetNamespace(), o.GetName()))
	})
}

// Reconciler runs inner only for requests of owned shards, in the shard's
// context (Begin): it carries the shard's fencing token
// (lease.TokenFromContext) and is cancelled when the shard moves. Requests
// of other shards return at once: their owner reconciles them.
func (r *Sharder) Reconciler(inner reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		sctx, done, ok := r.Begin(ctx, r.Of(req.Namespace, req.Name))
		if !ok {
			return reconcile.Result{}, nil
		}
		defer done()
		return inner.Reconcile(sctx, req)
	})
}

// Source enqueues, each time this replica acquires a shard, every object of
// that shard that c lists into list (a typed list such as
// &corev1.ConfigMapList{}): events filtered out while another replica owned
// the shard are not lost. Add it with builder.WatchesRawSource, before the
// Sharder starts.
func (r *Sharder) Source(c client.Reader, list client.ObjectList, opts ...client.ListOption) source.Source {
	q := &requeuer{r: r, c: c, list: list, opts: opts}
	prev := r.cfg.OnAcquired
	r.cfg.OnAcquired = func(s int) {
		if prev != nil {
			prev(s)
		}
		q.acquired(s)
	}
	return source.Func(q.start)
}

type requeuer struct {
	r    *Sharder
	c    client.Reader
	list client.ObjectList
	opts []client.ListOption

	mu      sync.Mutex
	ctx     context.Context
	queue   workqueue.TypedRateLimitingInterface[reconcile.Request]
	pending map[int]bool // shards acquired and not listed yet
	listing bool         // a lister runs
}

func (q *requeuer) start(ctx context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	q.mu.Lock()
	q.ctx, q.queue = ctx, queue
	q.mu.Unlock()
	q.acquired(-1)
	return nil
}

// acquired notes shard s (s < 0: none) and lists in the background
// (OnAcquired must not block). One lister at a time lists the objects once
// for every shard acquired meanwhile: a replica that takes many shards at
// once lists them once, not once a shard.
func (q *requeuer) acquired(s int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s >= 0 {
		if q.pending == nil {
			q.pending = map[int]bool{}
		}
		q.pending[s] = true
	}
	if q.queue == nil || q.listing || len(q.pending) == 0 {
		return // before the controller started, or the running lister takes it
	}
	q.listing = true
	go q.lister()
}

func (q *requeuer) lister() {
	for {
		q.mu.Lock()
		shards, ctx, queue := q.pending, q.ctx, q.queue
		q.pending = nil
		if len(shards) == 0 {
			q.listing = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		list := q.list.DeepCopyObject().(client.ObjectList)
		if err := q.c.List(ctx, list, q.opts...); err != nil {
			q.r.cfg.Logger.Warn("shard: listing objects of acquired shards", "shards", len(shards), "err", err)
			continue
		}
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			m, err := meta.Accessor(o)
			if err == nil && shards[q.r.Of(m.GetNamespace(), m.GetName())] {
				queue.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}})
			}
			return nil
		})
	}
}
