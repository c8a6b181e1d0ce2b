package leaderelection

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// ResourceLockOptions are what NewResourceLock needs besides the Config.
type ResourceLockOptions struct {
	// KubeConfig is the API server's config: required for "leases" and
	// "leases+pglease" (its timeout is set to max(RenewDeadline/2, 1s) on a
	// copy, as client-go and controller-runtime do).
	KubeConfig *rest.Config
	// EventRecorder receives the leader election events ("became leader",
	// with the epoch for the pg_lease locks). They are about the Lease named
	// after the key, <resourceNamespace>/<resourceName> by default; for
	// "pglease" it need not exist. A record.EventRecorder satisfies it.
	EventRecorder rl.EventRecorder
	// Labels are set on the Lease by the Kubernetes locks (client-go's
	// NewWithLabels).
	Labels map[string]string
	// LockOptions is the pg_lease lock's configuration besides what
	// NewResourceLock derives, e.g. OnEpochChange. It sets over it Key
	// (Config.pgLeaseKey), Identity, LeaseDuration (leaseDuration),
	// RenewDeadline and RetryPeriod (renewDeadline and retryPeriod), Margin
	// (the default), Waiter (the Waiter below or its own for "pglease", none
	// for "leases+pglease") and, when EventRecorder is set, the event fields
	// (about the Lease named above).
	LockOptions resourcelock.Config
	// Pool, when set, is used for the pg_lease lock instead of a pool
	// NewResourceLock opens from the Config's DSNFile or DSNEnv (and Close
	// then leaves it open). The pool it opens warms each connection (lease.WarmConn); set
	// AfterConnect = lease.WarmConn on a pool of your own for the same.
	Pool *pgxpool.Pool
	// Waiter, when set, is the process's listener the "pglease" lock waits
	// on (resourcelock.Config.Waiter), shared with the process's other locks;
	// Close then leaves it open. When nil, NewResourceLock opens one for the lock (one
	// connection LISTENing on channel pg_lease, from the pool's connection
	// settings) and Close closes it. "leases+pglease" never waits (see
	// MigrationLock) and gets none.
	Waiter *listen.Waiter
	// Ready is the candidate's readiness under Config.Handover (nil: always
	// ready). Flags.NewManager sets it: ready once the manager's caches synced.
	Ready func() bool
}

// ResourceLock is the client-go resourcelock.Interface a Config names,
// with what it holds open. Run it with the timings of its Config. Close it
// after the elector (or the manager) has stopped: a release on cancel still
// needs the database.
type ResourceLock struct {
	rl.Interface
	// Lock is the pg_lease lock ("pglease", or the pg_lease half of
	// "leases+pglease"); nil for "leases". Take fencing tokens from it.
	Lock *resourcelock.Lock
	// Config is the validated configuration the lock was built from (with
	// Identity filled).
	Config Config

	pool   *pgxpool.Pool
	waiter *listen.Waiter
}

// Close closes the listener and the pool NewResourceLock opened (if any).
// Call it after the elector or the manager stopped.
func (l *ResourceLock) Close() {
	if l.waiter != nil {
		_ = l.waiter.Close()
	}
	if l.pool != nil {
		l.pool.Close()
	}
}

// NewResourceLock checks c (component-base's validation, the resource lock
// name, the handover) and returns the lock it names:
//
//	leases          client-go's LeaseLock (coordination.k8s.io/v1 Lease)
//	pglease         a pg_lease lock (pkg/resourcelock) on Config.pgLeaseKey,
//	                TTL = leaseDuration, over a pool opened from the DSN (Config.DSNFile or DSNEnv),
//	                whose followers wait for news (resourcelock.Config.Waiter):
//	                a standby takes over within milliseconds of a release and
//	                at the server's expiry of a crashed leader's grant
//	leases+pglease  a NewMigrationLock of both, with one identity (its
//	                followers poll: see NewMigrationLock)
//
// The pg_lease lock is built by one resourcelock.New call with a
// resourcelock.Config that carries the key, the identity, the TTL
// (leaseDuration) and the timings (renewDeadline, retryPeriod), after the
// pool and the listen connection were opened (and they are closed again
// when it fails). New checks the timings against the TTL
// (resourcelock.Timing's rule); its complaints about them are named as the
// fields they came from (leaderElection.renewDeadline) and wrap
// ErrInvalidConfig.
//
// A disabled election (LeaderElect false) is an error: there is no lock to
// build. NewResourceLock needs no answer from PostgreSQL: the pool and the listen
// connection connect when the server can be reached, so a process started
// during a database restart elects once it is back.
func NewResourceLock(ctx context.Context, c Config, o ResourceLockOptions) (*ResourceLock, error) {
	if !c.LeaderElect {
		return nil, fmt.Errorf("%w: leaderElect is false: no lock to build", ErrInvalidConfig)
	}
	if err := c.validate(fieldRoot); err != nil {
		return nil, err
	}
	if c.Identity == "" {
		c.Identity = lease.DefaultOwner()
	}
	out := &ResourceLock{Config: c}
	var kube rl.Interface
	if c.ResourceLock == rl.LeasesResourceLock || c.ResourceLock == resourceLockMigration {
		if o.KubeConfig == nil {
			return nil, fmt.Errorf("%w: resourceLock %q needs a Kubernetes API config", ErrInvalidConfig, c.ResourceLock)
		}
		cfg := rest.AddUserAgent(rest.CopyConfig(o.KubeConfig), "leader-election")
		cfg.Timeout = max(c.RenewDeadline.Duration/2, time.Second)
		core, err := corev1client.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		coord, err := coordinationv1client.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		kube, err = rl.NewWithLabels(rl.LeasesResourceLock, c.ResourceNamespace, c.ResourceName, core, coord,
			rl.ResourceLockConfig{Identity: c.Identity, EventRecorder: o.EventRecorder}, o.Labels)
		if err != nil {
			return nil, err
		}
		if c.ResourceLock == rl.LeasesResourceLock {
			out.Interface = kube
			return out, nil
		}
	}

	pool := o.Pool
	if pool == nil {
		dsn, err := c.readDSN()
		if err != nil {
			return nil, err
		}
		pcfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			// pgx's parse errors can quote the connection string: never
			// pass them on.
			return nil, fmt.Errorf("%w: the DSN from %s does not parse as a PostgreSQL connection string", ErrInvalidConfig, c.dsnSource())
		}
		// Each new connection warm (lease.WarmConn): a handoff's first
		// acquire and release cost what later ones do.
		pcfg.AfterConnect = lease.WarmConn
		// A change whose wait for the synchronous standbys was cancelled is
		// never acknowledged (lease.ErrCommitUnknown).
		lease.ObserveCommits(&pcfg.ConnConfig.Config)
		// With several hosts, a frozen one costs each new connection a leash, not ConnectTimeout.
		lease.LeashSilentHostsPool(pcfg)
		if pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
			return nil, fmt.Errorf("leaderelection: opening the pool (DSN from %s): %w", c.dsnSource(), err)
		}
		out.pool = pool
	}
	lc := o.LockOptions
	lc.Key, lc.Identity, lc.Margin = c.pgLeaseKey(), c.Identity, 0
	lc.LeaseDuration, lc.RenewDeadline, lc.RetryPeriod = c.LeaseDuration.Duration, c.RenewDeadline.Duration, c.RetryPeriod.Duration
	if lc.Candidacy == nil && kube == nil {
		lc.Candidacy = c.candidacy(o.Ready)
	}
	if o.EventRecorder != nil {
		lc.EventRecorder, lc.EventNamespace = o.EventRecorder, c.ResourceNamespace
	}
	lc.Waiter = nil
	if kube == nil {
		// pglease: followers wait for news. Not for leases+pglease: there
		// the elector must see the Lease half at every RetryPeriod.
		w := o.Waiter
		if w == nil {
			var err error
			if w, err = listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{ConnectInBackground: true}); err != nil {
				out.Close()
				return nil, fmt.Errorf("leaderelection: opening the listen connection (DSN from %s): %w", c.dsnSource(), err)
			}
			out.waiter = w
		}
		lc.Waiter = w
	}
	pg, err := resourcelock.New(lease.New(pool), lc)
	if err != nil {
		out.Close()
		return nil, c.lockError(err, fieldRoot)
	}
	out.Lock = pg
	if kube == nil {
		out.Interface = pg
		return out, nil
	}
	m, err := NewMigrationLock(kube, pg)
	if err != nil {
		out.Close()
		return nil, err
	}
	out.Interface = m
	return out, nil
}
