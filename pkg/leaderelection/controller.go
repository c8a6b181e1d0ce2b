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

// ManagerConfig is what NewManager sets a manager up with.
type ManagerConfig struct {
	// Lock is the lock the manager's elector runs: PgLease itself, or a
	// composite whose pg_lease half is PgLease (the "leases+pglease" lock).
	Lock rl.Interface
	// PgLease is the pg_lease lock: its TTL checks the timings, its epochs
	// are the metrics' and the events'.
	PgLease *resourcelock.Lock
	// ReleaseOnCancel, when not nil, sets opts.LeaderElectionReleaseOnCancel;
	// nil leaves the caller's value as it is.
	ReleaseOnCancel *bool
}

// configure sets opts to elect the manager's leader through c.Lock, and
// returns the observedLock it installed: LeaderElection,
// LeaderElectionResourceLockInterface (c.Lock, wrapped in an observedLock
// that counts the metrics), LeaderElectionID (the key, when empty) and the
// timings. It changes LeaderElectionReleaseOnCancel only as
// c.ReleaseOnCancel says.
func configure(opts *manager.Options, c ManagerConfig) (*observedLock, error) {
	if opts == nil || c.Lock == nil || c.PgLease == nil {
		return nil, errors.New("leaderelection: manager options, Lock and PgLease must not be nil")
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
	// The one timing rule is the lock's: it fills the zero timings from its
	// TTL and checks them (client-go's rules, and RenewDeadline +
	// RetryPeriod < TTL - margin).
	t, err := c.PgLease.LeaderElectionConfig(want)
	if err != nil {
		return nil, fmt.Errorf("leaderelection: manager.Options: %w", err)
	}
	obs, err := observe(c.Lock, c.PgLease)
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

// NewManager makes a controller-runtime manager that elects its leader
// through c.Lock, a lock built by hand (resourcelock.New, or a composite
// over one). It sets opts' LeaderElection, LeaderElectionResourceLockInterface
// (c.Lock, wrapped so that the lock's epoch, transitions, renewal latency and
// errors go to controller-runtime's metrics registry), LeaderElectionID (the
// key, when empty) and the timings, then calls manager.New, after which the
// lock records the elector's events ("<identity> became leader (epoch N)")
// through the manager's event recorder, about a Lease named after the key
// ("namespace/name" keys split; otherwise in opts.LeaderElectionNamespace).
//
// Timings left nil are filled and all are checked by the lock
// (resourcelock.Lock.LeaderElectionConfig: LeaseDuration = TTL,
// RenewDeadline = 2/3, RetryPeriod = 2/15 of it; RenewDeadline +
// RetryPeriod below the TTL minus the lock's margin), each error naming the
// field.
//
// LeaderElectionReleaseOnCancel is the caller's unless c.ReleaseOnCancel
// says otherwise. Set it true to have a stopping leader free the key, so
// that its successor takes over at its next retry instead of waiting for
// the TTL; the lock ends the term (cancelling every fenced reconcile)
// before it frees the key.
func NewManager(cfg *rest.Config, opts manager.Options, c ManagerConfig) (manager.Manager, error) {
	if _, err := configure(&opts, c); err != nil {
		return nil, err
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	// The election's events are recorded with client-go's (core/v1) event
	// recorder, as client-go's own locks and controller-runtime do.
	c.PgLease.SetEventRecorder(mgr.GetEventRecorderFor(c.PgLease.Identity()), opts.LeaderElectionNamespace) //nolint:staticcheck
	return mgr, nil
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
// cause (lease.ErrLost, lease.ErrLocalDeadline, lease.ErrReleased), and the
// request is requeued whatever r returned.
//
// lock is the pg_lease lock the manager elects through: the one given to
// NewManager (ManagerConfig.PgLease), or PgLease(mgr) for a manager made by
// Flags.NewManager. A nil lock (PgLease of a manager that elects through a
// Kubernetes Lease, or with leader election off: there are no epochs)
// returns r as it is.
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
