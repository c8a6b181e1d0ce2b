package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
)

// Test hook: a ConfigMap annotated with a stall (a Go duration) makes the
// writer named by stall-writer (every writer when absent) hold its decided
// write back that long before sending it, as a process paused between its
// decision and its write would.
const (
	stallAnnotation       = "pglease.example/stall"
	stallWriterAnnotation = "pglease.example/stall-writer"
)

// reconciler writes each ConfigMap's result to the store under the fencing
// token of its context.
type reconciler struct {
	client client.Reader
	store  *store
	id     string
	// firstEpoch is the last epoch whose first Reconcile was reported.
	firstEpoch atomic.Int64
	// writeTimeout bounds a write once it is decided (the lease TTL): it
	// is not cancelled with the term, but a write stuck on an unreachable
	// store must not hold back the manager's exit after a lost leadership
	// (the manager waits for running reconciles).
	writeTimeout time.Duration
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	tok, ok := lease.TokenFromContext(ctx)
	if !ok {
		return reconcile.Result{}, errors.New("no fencing token in the reconcile context")
	}
	if prev := r.firstEpoch.Load(); tok.Epoch > prev && r.firstEpoch.CompareAndSwap(prev, tok.Epoch) {
		emit(event{Event: "reconcile", Resource: req.String(), Epoch: tok.Epoch})
	}
	var cm corev1.ConfigMap
	if err := r.client.Get(ctx, req.NamespacedName, &cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	res := result{
		Resource:        req.String(),
		Writer:          r.id,
		ResourceVersion: cm.ResourceVersion,
		Data:            cm.Data,
		Digest:          digest(cm.Data),
	}
	if res.Data == nil {
		res.Data = map[string]string{}
	}
	// Last check of the term before the write. From here on the write is
	// not cancelled with the term: once decided it may be on its way (the
	// process may pause right here), and the store's guard, not this
	// process, decides whether it is stale.
	if ctx.Err() != nil {
		return reconcile.Result{}, context.Cause(ctx)
	}
	if d := stall(&cm, r.id); d > 0 {
		emit(event{Event: "stall", Resource: res.Resource, Epoch: tok.Epoch, RV: res.ResourceVersion})
		time.Sleep(d)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.writeTimeout)
	defer cancel()
	err := r.store.write(wctx, tok, res)
	if stale, ok := errors.AsType[*fence.StaleError](err); ok {
		emit(event{Event: "stale", Resource: res.Resource, Epoch: tok.Epoch, RV: res.ResourceVersion, Highest: stale.Highest})
		return reconcile.Result{}, nil // a successor wrote: nothing to retry under this epoch
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	emit(event{Event: "write", Resource: res.Resource, Epoch: tok.Epoch, RV: res.ResourceVersion})
	return reconcile.Result{}, nil
}

func stall(cm *corev1.ConfigMap, id string) time.Duration {
	v, ok := cm.Annotations[stallAnnotation]
	if !ok {
		return 0
	}
	if w, ok := cm.Annotations[stallWriterAnnotation]; ok && w != id {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0
	}
	return d
}

// digest summarizes a ConfigMap's data (sorted key=value lines, SHA-256).
func digest(data map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		fmt.Fprintf(h, "%q=%q\n", k, data[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
