package leaderelection

import (
	"fmt"

	"k8s.io/component-base/config"
	"k8s.io/component-base/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/apimachinery/pkg/util/validation/field"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Internals the tests reach (package leaderelection_test).

// Decode (test only: how a component config's leaderElection: section,
// decoded by component-base's own v1alpha1 types and defaults, reaches
// Config) reads a serialized (v1alpha1) LeaderElectionConfiguration, as it
// appears under leaderElection: in a component config file, strictly (an
// unknown field is an error), fills component-base's recommended defaults
// (except the resource lock, which defaults to "leases", not the removed
// "endpoints") and converts it to the internal type.
//
//	leaderElect: true
//	resourceLock: pglease
//	resourceName: my-operator
//	resourceNamespace: my-namespace
//	leaseDuration: 15s
func Decode(data []byte) (config.LeaderElectionConfiguration, error) {
	var v v1alpha1.LeaderElectionConfiguration
	var out config.LeaderElectionConfiguration
	if err := yaml.UnmarshalStrict(data, &v); err != nil {
		return out, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if v.ResourceLock == "" {
		v.ResourceLock = rl.LeasesResourceLock
	}
	v1alpha1.RecommendedDefaultLeaderElectionConfiguration(&v)
	if err := v1alpha1.Convert_v1alpha1_LeaderElectionConfiguration_To_config_LeaderElectionConfiguration(&v, &out, nil); err != nil {
		return out, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return out, nil
}

type ObservedLock = observedLock

func Observe(lock rl.Interface, pg *resourcelock.Lock) (*ObservedLock, error) {
	return observe(lock, pg)
}

func ObservedPgLock(o *ObservedLock) *resourcelock.Lock { return o.pg }

// Configure is NewManagerForLock's setup of the options; it returns the
// lock the manager would run.
func Configure(opts *manager.Options, lock rl.Interface) (*ObservedLock, error) {
	if _, err := configure(opts, lock); err != nil {
		return nil, err
	}
	return opts.LeaderElectionResourceLockInterface.(*ObservedLock), nil
}

const (
	DefaultDSNEnv         = defaultDSNEnv
	DefaultLeaseDuration  = defaultLeaseDuration
	DefaultRenewDeadline  = defaultRenewDeadline
	DefaultRetryPeriod    = defaultRetryPeriod
	ResourceLockMigration = resourceLockMigration
)

var (
	DefaultConfig = defaultConfig
)

func PgLeaseKey(c *Config) string                   { return c.pgLeaseKey() }
func ReadDSN(c Config) (string, error)              { return c.readDSN() }
func IsSet(f *Flags, name string) bool              { return f.isSet(name) }
func Validate(c *Config, fldPath *field.Path) error { return c.validate(fldPath) }
func PoolOf(l *ResourceLock) *pgxpool.Pool          { return l.pool }

func MergedConfig(f *Flags, opts manager.Options) Config { return f.managerConfig(opts) }

var ErrEpochEnded = errEpochEnded
