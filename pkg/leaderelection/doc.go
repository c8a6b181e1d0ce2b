// Package leaderelection makes pg_lease a drop-in leader election lock for
// components configured the Kubernetes way: component-base's
// LeaderElectionConfiguration (the leaderElection: section of a component
// config) and the --leader-elect* flags, bound exactly as component-base
// binds them (options.BindLeaderElectionFlags), with two more resource lock
// names:
//
//	resourceLock: leases          client-go's Lease lock (the default)
//	resourceLock: pglease         one pg_lease key in PostgreSQL
//	resourceLock: leases+pglease  both: the migration mode (NewMigrationLock)
//
// The pg_lease key is <resourceNamespace>/<resourceName> (the Lease's name)
// unless --leader-elect-pglease-key says otherwise, its TTL is
// leaseDuration, and the PostgreSQL DSN is read from a file
// (--leader-elect-dsn-file, e.g. a mounted Secret) or an environment
// variable (--leader-elect-dsn-env, default $PGLEASE_DSN): no flag carries
// the DSN and no error or usage text quotes it.
//
// One call builds the lock: NewResourceLock returns a ready
// resourcelock.Interface (client-go's own for "leases") after checking the
// configuration with component-base's validation and the timings against
// the TTL (renewDeadline + retryPeriod must stay below leaseDuration minus
// the lock's margin, so that a leader that stopped renewing stops leading
// before its grant lapses). A kubebuilder main.go switches in three lines:
//
//	import pgle "github.com/pglease/pg_lease/pkg/leaderelection"
//	le := pgle.BindFlags(flag.CommandLine)          // before flag.Parse()
//	mgr, err := le.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{ // was ctrl.NewManager
//
// and then runs with --leader-elect --leader-elect-resource-lock=pglease and
// the DSN in $PGLEASE_DSN. With the default --leader-elect-resource-lock
// (leases) it behaves exactly as before.
//
// # Managers
//
// One constructor per need:
//
//	Flags.NewManager   a program configured by the --leader-elect* flags (ctrl.NewManager's signature)
//	NewManagerForLock  a lock built by hand: a resourcelock.Lock, a NewMigrationLock, or a ResourceLock
//
// A program that builds its own pg_lease lock (resourcelock.New) plugs it
// into a controller-runtime manager with NewManagerForLock, and hands each
// reconcile the fencing token of the epoch it runs under with Fenced:
//
//	w, _ := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{}) // one per process; Close after mgr.Start returns
//	lock, _ := resourcelock.New(lease.New(pool), resourcelock.Config{Key: "my-operator", Identity: lease.DefaultOwner(), Waiter: w})
//	opts := manager.Options{LeaderElectionReleaseOnCancel: true, ...}
//	mgr, err := leaderelection.NewManagerForLock(cfg, opts, lock)
//	ctrl.NewControllerManagedBy(mgr).For(&v1.Thing{}).Complete(leaderelection.Fenced(lock, &ThingReconciler{}))
//
// Build the lock with a Waiter (resourcelock.Config.Waiter): a standby's
// elector then waits for news of the key and takes over within milliseconds
// of the leader's release (and at the server's expiry of a crashed leader's
// grant) instead of at its next RetryPeriod (up to 2.4 s at
// controller-runtime's defaults). Flags.NewManager and NewResourceLock do
// it for you.
//
// Both constructors run the lock wrapped so that the lock's epoch, transitions,
// renewal latency and errors go to controller-runtime's metrics registry
// (pg_lease_lock_epoch, pg_lease_lock_transitions_total,
// pg_lease_lock_renew_duration_seconds, pg_lease_lock_errors_total: see
// docs/operations.md), and client-go's election events are recorded
// through the manager's event recorder with the epoch ("<identity> became
// leader (epoch 7)"). They leave LeaderElectionReleaseOnCancel as the
// caller set it (set it true to hand over at once when the leader stops).
//
// The timings (LeaseDuration, RenewDeadline, RetryPeriod) follow one rule,
// the pure function resourcelock.Timing: zero ones are filled from the TTL
// in client-go's proportions, and RenewDeadline + RetryPeriod must stay
// below the TTL minus the lock's margin (lease.CheckMargin). Each path
// evaluates it once: resourcelock.New for a Config (NewResourceLock hands
// it the TTL and the timings in one resourcelock.Config, and names its
// complaints as the component config's fields), the lock's
// LeaderElectionConfig for a manager's timings given to a lock built by
// hand.
//
// controller-runtime runs the real client-go elector with the lock
// (Options.LeaderElectionResourceLockInterface). The manager does not hand
// its leader context to reconcilers, and a lapse followed by
// re-acquisition under the same identity is, for client-go, one continuous
// leadership with a new epoch (see package resourcelock). So reconcilers
// must not take the token once: Fenced gives every Reconcile a context that
// carries the token of the epoch current when it starts and is cancelled
// when that epoch ends, and refuses to reconcile (returns an error wrapping
// resourcelock.ErrNotHolding, so the request is requeued with backoff) when
// the lock holds no live, unexpired term. With a manager made by
// Flags.NewManager, wrap with Fenced(LockOf(mgr), r): with a Kubernetes
// lock LockOf is nil and r runs as it is.
package leaderelection
