package leaderelection

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// pgLockOf returns the pg_lease lock that lock elects through: lock itself
// or the pg_lease half of a NewMigrationLock; nil for any other lock.
func pgLockOf(lock rl.Interface) *resourcelock.Lock {
	switch l := lock.(type) {
	case *resourcelock.Lock:
		return l
	case *migrationLock:
		return l.Lock
	}
	return nil
}

// configure sets opts to elect through lock (NewManagerForLock). The
// timings opts leaves nil are filled, and all are checked, by the pg_lease
// lock's rule (resourcelock.Timing). It returns the pg_lease lock.
func configure(opts *manager.Options, lock rl.Interface) (*resourcelock.Lock, error) {
	if r, ok := lock.(*ResourceLock); ok {
		lock = r.Interface
	}
	pg := pgLockOf(lock)
	if opts == nil || pg == nil {
		return nil, fmt.Errorf("%w: manager options and a lock with a pg_lease lock are required, got %T", ErrInvalidConfig, lock)
	}
	var want leaderelection.LeaderElectionConfig
	if opts.LeaseDuration != nil {
		want.LeaseDuration = *opts.LeaseDuration
	}
	if opts.RenewDeadline != nil {
		want.RenewDeadline = *opts.RenewDeadline
	}
	if opts.RetryPeriod != nil {
		want.RetryPeriod = *opts.RetryPeriod
	}
	t, err := pg.LeaderElectionConfig(want)
	if err != nil {
		return nil, fmt.Errorf("%w: manager.Options: %w", ErrInvalidConfig, err)
	}
	return pg, electThrough(opts, lock, pg, t)
}

// electThrough sets opts to elect through lock, whose pg_lease lock is pg,
// with timings t that the rule already checked: LeaderElection,
// LeaderElectionResourceLockInterface (lock, wrapped so that it counts the
// metrics), LeaderElectionID (the key, when empty) and the timings.
func electThrough(opts *manager.Options, lock rl.Interface, pg *resourcelock.Lock, t leaderelection.LeaderElectionConfig) error {
	obs, err := observe(lock, pg)
	if err != nil {
		return err
	}
	opts.LeaderElection = true
	opts.LeaderElectionResourceLockInterface = obs
	if opts.LeaderElectionID == "" {
		opts.LeaderElectionID = pg.Key()
	}
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &t.LeaseDuration, &t.RenewDeadline, &t.RetryPeriod
	return nil
}

// newManager calls manager.New with options electThrough set, then has pg
// record the election's events through the manager's event recorder.
func newManager(cfg *rest.Config, opts manager.Options, pg *resourcelock.Lock) (manager.Manager, error) {
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	// client-go's (core/v1) event recorder, as client-go's own locks and
	// controller-runtime use.
	pg.SetEventRecorder(mgr.GetEventRecorderFor(pg.Identity()), opts.LeaderElectionNamespace) //nolint:staticcheck
	return mgr, nil
}

// NewManagerForLock makes a controller-runtime manager that elects its
// leader through lock, built by hand: a resourcelock.Lock, a
// NewMigrationLock over one, or a ResourceLock with a pg_lease lock.
// Flags.NewManager is the call for a program configured by flags.
//
// It sets opts' LeaderElection, LeaderElectionResourceLockInterface (lock,
// wrapped so that its epoch, transitions, renewal latency and errors go to
// controller-runtime's metrics registry), LeaderElectionID (the key, when
// empty) and the timings, then calls manager.New. The lock then records
// the elector's events ("<identity> became leader (epoch N)") through the
// manager's event recorder, about a Lease named after the key
// ("namespace/name" keys split; otherwise in opts.LeaderElectionNamespace).
//
// Timings left nil are filled and all are checked by the lock's rule
// (resourcelock.Timing: LeaseDuration = TTL, RenewDeadline = 2/3 and
// RetryPeriod = 2/15 of it; RenewDeadline + RetryPeriod below the TTL minus
// the lock's margin); each error names the field.
//
// LeaderElectionReleaseOnCancel is the caller's. Set it true to have a
// stopping leader free the key, so that its successor takes over at its
// next retry instead of waiting for the TTL. The lock ends the term
// (cancelling every fenced reconcile) before it frees the key.
func NewManagerForLock(cfg *rest.Config, opts manager.Options, lock rl.Interface) (manager.Manager, error) {
	pg, err := configure(&opts, lock)
	if err != nil {
		return nil, err
	}
	return newManager(cfg, opts, pg)
}

// errEpochEnded is wrapped by the error of a Fenced reconciler whose epoch ended while it
// ran, whatever the wrapped reconciler returned: the request is requeued and
// runs again under the next epoch. The reconciler's own error is wrapped too,
// except a reconcile.TerminalError (it would make controller-runtime drop the
// request), of which only the text is kept.
var errEpochEnded = errors.New("leaderelection: the epoch ended during the reconcile")

// Fenced wraps r so that each Reconcile runs with a context that carries the
// lock's current fencing token (lease.TokenFromContext) and is cancelled
// when that epoch ends. Without a live, unexpired term it does not call r
// and returns an error wrapping resourcelock.ErrNotHolding, so the request
// is requeued. When the epoch ends while r runs, the error wraps the term's
// cause (lease.ErrLost, lease.ErrLocalDeadline, lease.ErrReleased,
// resourcelock.ErrStoppedLeading), and the request is requeued whatever r
// returned.
//
// lock is the pg_lease lock the manager elects through: the one given to
// NewManagerForLock, or LockOf(mgr) for a manager made by Flags.NewManager.
// A nil lock (LockOf a manager that elects through a Kubernetes Lease, or
// with leader election off: there are no epochs) returns r as it is.
func Fenced[request comparable](lock *resourcelock.Lock, r reconcile.TypedReconciler[request]) reconcile.TypedReconciler[request] {
	if lock == nil {
		return r
	}
	return &fenced[request]{lock: lock, r: r}
}

type fenced[request comparable] struct {
	lock *resourcelock.Lock
	r    reconcile.TypedReconciler[request]
}

func (f *fenced[request]) Reconcile(ctx context.Context, req request) (reconcile.Result, error) {
	tctx, cancel, err := f.lock.TokenContext(ctx)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("leaderelection: no valid fencing token, not reconciling: %w", err)
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
// wraps errEpochEnded and the cause, and the reconciler's own error too
// unless that one is (or contains) a reconcile.TerminalError. A terminal
// error means "retrying cannot help" for the epoch the reconcile ran under;
// under the next epoch it can, and controller-runtime drops, without a
// requeue, every request whose error satisfies errors.Is(err,
// reconcile.TerminalError(nil)). Then only the inner error's text is kept.
func epochEnded(tok lease.Token, cause, inner error) error {
	ended := fmt.Errorf("%w: %v: %w", errEpochEnded, tok, cause)
	switch {
	case inner == nil:
		return ended
	case errors.Is(inner, reconcile.TerminalError(nil)):
		return fmt.Errorf("%w (the reconciler's terminal error, retried under the next epoch: %v)", ended, inner)
	default:
		return errors.Join(ended, inner)
	}
}
