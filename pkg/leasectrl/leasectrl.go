// Package leasectrl plugs a pg_lease resourcelock.Lock into a
// controller-runtime manager and hands each reconcile the fencing token of
// the epoch it runs under.
//
//	w, _ := lease.NewWaiter(ctx, dsn, lease.WaiterOptions{}) // one per process; Close after mgr.Start returns
//	lock, _ := resourcelock.New(lease.New(pool), "my-operator", podName, resourcelock.WithWaiter(w))
//	opts := manager.Options{...}
//	mgr, err := leasectrl.NewManager(cfg, opts, leasectrl.ManagerConfig{Lock: lock, PgLease: lock})
//	ctrl.NewControllerManagedBy(mgr).For(&v1.Thing{}).Complete(leasectrl.Fenced(lock, &ThingReconciler{}))
//
// Build the lock with resourcelock.WithWaiter: a standby's elector then
// waits for news of the key and takes over within milliseconds of the
// leader's release (and at the server's expiry of a crashed leader's
// grant) instead of at its next RetryPeriod (up to 2.4 s at
// controller-runtime's defaults). leaderelection.Flags.NewManager does it
// for you.
//
// NewManager (Configure, then manager.New) runs the lock wrapped in an
// ObservedLock: the lock's epoch, transitions, renewal latency and errors
// go to controller-runtime's metrics registry (names beside client-go's in
// ObservedLock's documentation and docs/operations.md), and client-go's
// election events are recorded through the manager's event recorder with
// the epoch ("<identity> became leader (epoch 7)"). It leaves
// LeaderElectionReleaseOnCancel as the caller set it unless
// ManagerConfig.ReleaseOnCancel says otherwise; ConfigureManager, the older
// one-call form, sets it to true (documented at the function).
//
// controller-runtime runs the real client-go elector with the lock
// (Options.LeaderElectionResourceLockInterface); LeaseDuration, RenewDeadline
// and RetryPeriod still apply to it. The manager does not hand its leader
// context to reconcilers, and a lapse followed by re-acquisition under the
// same identity is, for client-go, one continuous leadership with a new
// epoch (see package resourcelock). So reconcilers must not take the token
// once: Fenced gives every Reconcile a context that carries the token of the
// epoch current when it starts and is cancelled when that epoch ends, and
// refuses to reconcile (returns an error, so the request is requeued with
// backoff) when the lock holds no live, unexpired term.
package leasectrl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Timing is client-go's leader election timing.
type Timing struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// TimingFor returns timings consistent with a lease TTL, in client-go's
// default proportions (15s/10s/2s for a 15s TTL): LeaseDuration = ttl (how
// long followers wait for a change before they try; the server decides),
// RenewDeadline = ttl·2/3, RetryPeriod = ttl·2/15. The elector thus gives up
// leading after at most RetryPeriod + RenewDeadline = 0.8·ttl without a
// successful renewal, before the grant can lapse.
func TimingFor(ttl time.Duration) Timing {
	return Timing{LeaseDuration: ttl, RenewDeadline: ttl * 2 / 3, RetryPeriod: ttl * 2 / 15}
}

// Check validates t against client-go's own rules and against the lock's
// TTL: the elector must stop leading (RetryPeriod + RenewDeadline without a
// renewal) before the grant lapses (ttl).
func (t Timing) Check(ttl time.Duration) error {
	var errs []error
	if t.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("RetryPeriod must be positive, got %v", t.RetryPeriod))
	}
	if t.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(t.RetryPeriod)) {
		errs = append(errs, fmt.Errorf("RenewDeadline (%v) must be greater than RetryPeriod (%v) × %v",
			t.RenewDeadline, t.RetryPeriod, leaderelection.JitterFactor))
	}
	if t.LeaseDuration <= t.RenewDeadline {
		errs = append(errs, fmt.Errorf("LeaseDuration (%v) must be greater than RenewDeadline (%v)", t.LeaseDuration, t.RenewDeadline))
	}
	if t.LeaseDuration < time.Second {
		errs = append(errs, fmt.Errorf("LeaseDuration must be at least 1s (client-go counts whole seconds), got %v", t.LeaseDuration))
	}
	if t.RenewDeadline+t.RetryPeriod >= ttl {
		errs = append(errs, fmt.Errorf("RenewDeadline + RetryPeriod (%v) must be below the lock's LeaseDuration (TTL %v)",
			t.RenewDeadline+t.RetryPeriod, ttl))
	}
	return errors.Join(errs...)
}

// ConfigureManager sets opts to elect the manager's leader through lock:
// LeaderElection, LeaderElectionResourceLockInterface (lock, wrapped in an
// ObservedLock for the metrics), LeaderElectionID (the key, when empty) and
// the timings. Timings left nil come from TimingFor(lock's TTL); all are
// then checked (Timing.Check), and each error names the field.
//
// It OVERRIDES LeaderElectionReleaseOnCancel with true, whatever the caller
// set: a stopping leader then frees the key, so that its successor takes
// over at its next retry instead of waiting for the TTL, and the lock ends
// the term (cancelling every fenced reconcile) before it frees the key. To
// keep false, set opts.LeaderElectionReleaseOnCancel after this call, or
// use Configure, which leaves it alone unless told.
//
// Events: the manager's recorder exists only once the manager does; use
// NewManager to have "became leader (epoch N)" recorded through it.
func ConfigureManager(opts *manager.Options, lock *resourcelock.Lock) error {
	if opts == nil || lock == nil {
		return errors.New("leasectrl.ConfigureManager: opts and lock must not be nil")
	}
	release := true
	_, err := Configure(opts, ManagerConfig{Lock: lock, PgLease: lock, ReleaseOnCancel: &release})
	return err
}

// ManagerConfig is what Configure and NewManager set a manager up with.
type ManagerConfig struct {
	// Lock is the lock the manager's elector runs: PgLease itself, or a
	// composite whose pg_lease half is PgLease (leaderelection.MigrationLock).
	Lock rl.Interface
	// PgLease is the pg_lease lock: its TTL checks the timings, its epochs
	// are the metrics' and the events'.
	PgLease *resourcelock.Lock
	// ReleaseOnCancel, when not nil, sets opts.LeaderElectionReleaseOnCancel;
	// nil leaves the caller's value as it is.
	ReleaseOnCancel *bool
}

// Configure sets opts like ConfigureManager, for any lock over a pg_lease
// lock, and returns the ObservedLock it installed. It changes
// LeaderElectionReleaseOnCancel only as c.ReleaseOnCancel says.
func Configure(opts *manager.Options, c ManagerConfig) (*ObservedLock, error) {
	if opts == nil || c.Lock == nil || c.PgLease == nil {
		return nil, errors.New("leasectrl.Configure: opts, Lock and PgLease must not be nil")
	}
	ttl := c.PgLease.LeaseDuration()
	t := TimingFor(ttl)
	if opts.LeaseDuration != nil {
		t.LeaseDuration = *opts.LeaseDuration
	}
	if opts.RenewDeadline != nil {
		t.RenewDeadline = *opts.RenewDeadline
	}
	if opts.RetryPeriod != nil {
		t.RetryPeriod = *opts.RetryPeriod
	}
	if err := t.Check(ttl); err != nil {
		return nil, fmt.Errorf("leasectrl.ConfigureManager: manager.Options: %w", err)
	}
	obs, err := Observe(c.Lock, c.PgLease)
	if err != nil {
		return nil, err
	}
	opts.LeaderElection = true
	opts.LeaderElectionResourceLockInterface = obs
	if c.ReleaseOnCancel != nil {
		opts.LeaderElectionReleaseOnCancel = *c.ReleaseOnCancel
	}
	if opts.LeaderElectionID == "" {
		opts.LeaderElectionID = c.PgLease.Key()
	}
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &t.LeaseDuration, &t.RenewDeadline, &t.RetryPeriod
	return obs, nil
}

// NewManager is Configure followed by manager.New, after which the lock
// records the elector's events ("<identity> became leader (epoch N)")
// through the manager's event recorder, about a Lease named after the key
// ("namespace/name" keys split; otherwise in opts.LeaderElectionNamespace).
func NewManager(cfg *rest.Config, opts manager.Options, c ManagerConfig) (manager.Manager, error) {
	obs, err := Configure(&opts, c)
	if err != nil {
		return nil, err
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	// The election's events are recorded with client-go's (core/v1) event
	// recorder, as client-go's own locks and controller-runtime do.
	obs.SetEventRecorder(mgr.GetEventRecorderFor(c.PgLease.Identity()), nil, opts.LeaderElectionNamespace) //nolint:staticcheck
	return mgr, nil
}

// ErrNoToken is returned by a Fenced reconciler that runs while the lock
// holds no live, unexpired term (between epochs, or after losing the lease).
var ErrNoToken = errors.New("leasectrl: no valid fencing token; not reconciling")

// ErrEpochEnded is returned by a Fenced reconciler whose epoch ended while it
// ran, whatever the wrapped reconciler returned: the request is requeued and
// runs again under the next epoch. The reconciler's own error is wrapped too,
// except a reconcile.TerminalError (it would make controller-runtime drop the
// request), of which only the text is kept.
var ErrEpochEnded = errors.New("leasectrl: the epoch ended during the reconcile")

// Fenced wraps r so that each Reconcile runs with a context that carries the
// lock's current fencing token (lease.TokenFromContext) and is cancelled
// when that epoch ends. Without a live, unexpired term it does not call r
// and returns an error wrapping ErrNoToken, so the request is requeued.
func Fenced[request comparable](lock *resourcelock.Lock, r reconcile.TypedReconciler[request]) reconcile.TypedReconciler[request] {
	return &fenced[request]{lock: lock, r: r}
}

type fenced[request comparable] struct {
	lock *resourcelock.Lock
	r    reconcile.TypedReconciler[request]
}

func (f *fenced[request]) Reconcile(ctx context.Context, req request) (reconcile.Result, error) {
	tctx, cancel, err := f.lock.TokenContext(ctx)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("%w: %w", ErrNoToken, err)
	}
	defer cancel()
	res, err := f.r.Reconcile(tctx, req)
	if ctx.Err() == nil && tctx.Err() != nil {
		tok, _ := lease.TokenFromContext(tctx)
		return reconcile.Result{}, epochEnded(tok, context.Cause(tctx), err)
	}
	return res, err
}

// epochEnded is the error of a reconcile whose epoch ended while it ran: it
// wraps ErrEpochEnded and the cause, and the reconciler's own error too
// unless that one is (or contains) a reconcile.TerminalError. A terminal
// error means "retrying cannot help" for the epoch the reconcile ran under;
// under the next epoch it can, and controller-runtime drops, without a
// requeue, every request whose error satisfies errors.Is(err,
// reconcile.TerminalError(nil)). Then only the inner error's text is kept.
func epochEnded(tok lease.Token, cause, inner error) error {
	ended := fmt.Errorf("%w: %v: %w", ErrEpochEnded, tok, cause)
	switch {
	case inner == nil:
		return ended
	case errors.Is(inner, reconcile.TerminalError(nil)):
		return fmt.Errorf("%w (the reconciler's terminal error, retried under the next epoch: %v)", ended, inner)
	default:
		return errors.Join(ended, inner)
	}
}
