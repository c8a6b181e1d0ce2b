package leaderelection

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pglease/pg_lease/pkg/resourcelock"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// inClusterNamespace is where a pod's namespace is mounted (controller-runtime
// defaults LeaderElectionNamespace from it too).
// fieldRoot is the path errors name fields under, as a component config's
// leaderElection: section.
var fieldRoot = field.NewPath("leaderElection")

const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// managerConfig merges the flags into a manager's options: a flag given on
// the command line wins; otherwise the option the program set
// (LeaderElectionID as resourceName, LeaderElectionNamespace,
// LeaderElectionResourceLock, LeaseDuration, RenewDeadline, RetryPeriod);
// otherwise the flag's default. --leader-elect, when a kubebuilder scaffold
// defines it itself (BindFlags then does not), comes from
// opts.LeaderElection. The namespace defaults to the pod's own, as
// controller-runtime's does.
func (f *Flags) managerConfig(opts manager.Options) Config {
	c := f.Config
	if !f.bound("leader-elect") {
		c.LeaderElect = opts.LeaderElection
	}
	pick := func(flag string, cur *string, opt string) {
		if !f.isSet(flag) && opt != "" {
			*cur = opt
		}
	}
	pick("leader-elect-resource-name", &c.ResourceName, opts.LeaderElectionID)
	pick("leader-elect-resource-namespace", &c.ResourceNamespace, opts.LeaderElectionNamespace)
	pick("leader-elect-resource-lock", &c.ResourceLock, opts.LeaderElectionResourceLock)
	dur := func(flag string, cur *metav1.Duration, opt *time.Duration) {
		if !f.isSet(flag) && opt != nil {
			cur.Duration = *opt
		}
	}
	dur("leader-elect-lease-duration", &c.LeaseDuration, opts.LeaseDuration)
	dur("leader-elect-renew-deadline", &c.RenewDeadline, opts.RenewDeadline)
	dur("leader-elect-retry-period", &c.RetryPeriod, opts.RetryPeriod)
	if c.ResourceNamespace == "" {
		if b, err := os.ReadFile(inClusterNamespace); err == nil {
			c.ResourceNamespace = strings.TrimSpace(string(b))
		}
	}
	return c
}

// NewManager has ctrl.NewManager's signature (swap one for the other in a
// kubebuilder main.go) and elects as the flags say:
//
//   - --leader-elect off, or --leader-elect-resource-lock=leases: the
//     options go to controller-runtime as they are, with the flags' values
//     merged in (managerConfig): the manager builds client-go's LeaseLock
//     itself, as without this package;
//   - pglease or leases+pglease: NewResourceLock builds the lock (DSN from
//     the file or the environment variable), the manager runs it with its
//     metrics and the manager's event recorder (as NewManagerForLock does), the lock's Check is added
//     as the health check healthzCheckName, and the manager's Start closes
//     the pool and the listen connection after the manager stopped (after
//     the release on cancel). With pglease a standby's elector waits for
//     news (resourcelock.Config.Waiter): it takes over within milliseconds of
//     the leader's release, and at the server's expiry of a crashed
//     leader's grant, at any RetryPeriod; nothing to configure.
//
// The configuration is checked with component-base's validation and, for
// the pg_lease locks, the timings against the TTL by the lock itself
// (resourcelock.New, through NewResourceLock), once; every error names its
// field. LeaderElectionReleaseOnCancel is the caller's, never overridden
// (kubebuilder scaffolds leave it false: a stopped leader's successor then
// waits for the TTL; set it true to hand over at once).
func (f *Flags) NewManager(cfg *rest.Config, opts manager.Options) (manager.Manager, error) {
	c := f.managerConfig(opts)
	if !c.LeaderElect || !c.usesPgLease() {
		ld, rd, rp := c.LeaseDuration.Duration, c.RenewDeadline.Duration, c.RetryPeriod.Duration
		opts.LeaderElection = c.LeaderElect
		opts.LeaderElectionID, opts.LeaderElectionNamespace = c.ResourceName, c.ResourceNamespace
		opts.LeaderElectionResourceLock = c.ResourceLock
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &ld, &rd, &rp
		if c.LeaderElect {
			if err := c.validate(fieldRoot); err != nil {
				return nil, err
			}
		}
		return manager.New(cfg, opts)
	}
	lcfg := opts.LeaderElectionConfig
	if lcfg == nil {
		lcfg = cfg
	}
	var built atomic.Pointer[manager.Manager]
	lock, err := NewResourceLock(context.Background(), c, ResourceLockOptions{KubeConfig: lcfg, Labels: opts.LeaderElectionLabels,
		Ready: cacheReady(&built)})
	if err != nil {
		return nil, err
	}
	opts.LeaderElectionID, opts.LeaderElectionNamespace = c.ResourceName, c.ResourceNamespace
	// The lock checked the timings against the TTL (resourcelock.New).
	t := leaderelection.LeaderElectionConfig{
		LeaseDuration: c.LeaseDuration.Duration, RenewDeadline: c.RenewDeadline.Duration, RetryPeriod: c.RetryPeriod.Duration,
	}
	if err := electThrough(&opts, lock.Interface, lock.Lock, t); err != nil {
		lock.Close()
		return nil, err
	}
	mgr, err := newManager(cfg, opts, lock.Lock)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("leaderelection: %w", err)
	}
	built.Store(&mgr)
	// /healthz fails when the lock holds a grant its elector stopped
	// renewing (resourcelock.Lock.Check): restarting such a process ends it.
	if err := mgr.AddHealthzCheck(healthzCheckName, lock.Lock.Check); err != nil {
		lock.Close()
		return nil, fmt.Errorf("leaderelection: %w", err)
	}
	return &closingManager{Manager: mgr, lock: lock}, nil
}

// healthzCheckName is the name of the health check Flags.NewManager adds
// for the pg_lease lock.
const healthzCheckName = "leader-election-pglease"

// closingManager closes the lock's pool when Start returns.
type closingManager struct {
	manager.Manager
	lock *ResourceLock
}

func (m *closingManager) Start(ctx context.Context) error {
	defer m.lock.Close()
	return m.Manager.Start(ctx)
}

// LockOf returns the pg_lease lock of a manager made by Flags.NewManager
// (for Fenced); nil when it elects through a Kubernetes lock or was made
// otherwise.
func LockOf(mgr manager.Manager) *resourcelock.Lock {
	if m, ok := mgr.(*closingManager); ok {
		return m.lock.Lock
	}
	return nil
}

var _ rl.Interface = (*ResourceLock)(nil)
