package leaderelection

import (
	"time"

	"github.com/pglease/pg_lease/pkg/resourcelock"
	"k8s.io/apimachinery/pkg/util/validation/field"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Internals the tests reach (package leaderelection_test).

type ObservedLock = observedLock

func Observe(lock rl.Interface, pg *resourcelock.Lock) (*ObservedLock, error) {
	return observe(lock, pg)
}

func ObservedPgLease(o *ObservedLock) *resourcelock.Lock { return o.pg }

func Configure(opts *manager.Options, c ManagerConfig) (*ObservedLock, error) {
	return configure(opts, c)
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
	Decode        = decode
)

func PgLeaseKey(c *Config) string                   { return c.pgLeaseKey() }
func ReadDSN(c Config) (string, error)              { return c.readDSN() }
func IsSet(f *Flags, name string) bool              { return f.isSet(name) }
func Validate(c *Config, fldPath *field.Path) error { return c.validate(fldPath) }
func Timing(l *Lock) (ld, rd, rp time.Duration)     { return l.timing() }

func ManagerConfigOf(f *Flags, opts manager.Options) Config { return f.managerConfig(opts) }

var ErrEpochEnded = errEpochEnded
