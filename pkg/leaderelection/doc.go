// Package leaderelection makes pg_lease a drop-in leader election lock for
// components configured the Kubernetes way: component-base's
// LeaderElectionConfiguration (the leaderElection: section of a component
// config) and the --leader-elect* flags, bound exactly as component-base
// binds them (options.BindLeaderElectionFlags), with two more resource lock
// names:
//
//	resourceLock: leases          client-go's Lease lock (the default)
//	resourceLock: pglease         one pg_lease key in PostgreSQL
//	resourceLock: leases+pglease  both: the migration mode (MigrationLock)
//
// The pg_lease key is <resourceNamespace>/<resourceName> (the Lease's name)
// unless --leader-elect-pglease-key says otherwise, its TTL is
// leaseDuration, and the PostgreSQL DSN is read from a file
// (--leader-elect-dsn-file, e.g. a mounted Secret) or an environment
// variable (--leader-elect-dsn-env, default $PGLEASE_DSN): no flag carries
// the DSN and no error or usage text quotes it.
//
// One call builds the lock: New returns a ready resourcelock.Interface
// (client-go's own for "leases") after checking the configuration with
// component-base's validation and the timings against the TTL
// (renewDeadline + retryPeriod must stay below leaseDuration minus the
// lock's margin, so that a leader that stopped renewing stops leading
// before its grant lapses). A kubebuilder main.go switches in three lines:
//
//	import pgle "github.com/pglease/pg_lease/pkg/leaderelection"
//	le := pgle.BindFlags(flag.CommandLine)          // before flag.Parse()
//	mgr, err := le.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{ // was ctrl.NewManager
//
// and then runs with --leader-elect --leader-elect-resource-lock=pglease and
// the DSN in $PGLEASE_DSN. With the default --leader-elect-resource-lock
// (leases) it behaves exactly as before.
package leaderelection
