package leaderelection

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pglease/pg_lease/pkg/resourcelock"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/component-base/config"
	cbvalidation "k8s.io/component-base/config/validation"
)

// Resource lock names (LeaderElectionConfiguration.ResourceLock and
// --leader-elect-resource-lock) this package adds to client-go's "leases".
const (
	// resourceLockPgLease elects through one pg_lease key in PostgreSQL.
	resourceLockPgLease = "pglease"
	// resourceLockMigration elects through both the coordination.k8s.io
	// Lease and the pg_lease key: a candidate leads only while it holds both
	// (see NewMigrationLock). It is the setting of the rollout that moves a
	// component from "leases" to "pglease".
	resourceLockMigration = rl.LeasesResourceLock + "+" + resourceLockPgLease
)

// defaultDSNEnv is the environment variable the DSN is read from when
// neither Config.DSNFile nor Config.DSNEnv is set.
const defaultDSNEnv = "PGLEASE_DSN"

// Default timings: client-go's and controller-runtime's (component-base's
// recommended defaults).
const (
	defaultLeaseDuration = 15 * time.Second
	defaultRenewDeadline = 10 * time.Second
	defaultRetryPeriod   = 2 * time.Second
)

// ErrInvalidConfig is wrapped by every validation error of a Config, and
// by NewResourceLock's error when the DSN's source holds no DSN or one that does not
// parse.
var ErrInvalidConfig = errors.New("leaderelection: invalid configuration")

// Config is component-base's LeaderElectionConfiguration (the type
// kube-controller-manager, kube-scheduler and component configs embed) plus
// what a pg_lease lock needs besides: where the DSN comes from and,
// optionally, the identity.
type Config struct {
	config.LeaderElectionConfiguration
	// DSNFile is the path of a file holding the PostgreSQL connection
	// string of the pg_lease lock (pglease and leases+pglease only), such
	// as a mounted Secret key; surrounding white space is trimmed. Takes
	// precedence over DSNEnv.
	//
	// The DSN is read from a file or an environment variable, never a flag
	// value, so that it (and its password) never appears in usage text,
	// flag defaults or process listings; errors name the file or the
	// variable, never any part of the DSN.
	DSNFile string
	// DSNEnv is the name of the environment variable holding the DSN when
	// DSNFile is empty. Default PGLEASE_DSN.
	DSNEnv string
	// Identity of this candidate; must be unique among candidates. Default:
	// lease.DefaultOwner (hostname-PID-random).
	Identity string
	// Key overrides the pg_lease key. Default ResourceNamespace + "/" +
	// ResourceName, the same name as the Lease of the Kubernetes locks.
	Key string
	// Handover (pglease only) makes this candidate register for the key,
	// so that the leader's release hands it over directly, and sets the
	// key's strategy: "priority", "newest-version", "oldest-version"; ""
	// or "any": no handover (a release frees the key for the race).
	Handover string
	// Version is this candidate's semantic version for the version
	// strategies. Default: the main module's version, when it has one.
	Version string
}

// readDSN returns the DSN, from DSNFile or else DSNEnv. Its errors wrap
// ErrInvalidConfig and name the file or the variable, never any part of the
// DSN.
func (c *Config) readDSN() (string, error) {
	if c.DSNFile != "" {
		b, err := os.ReadFile(c.DSNFile)
		if err != nil {
			// os errors name the path only.
			return "", fmt.Errorf("%w: no PostgreSQL DSN: reading the DSN file: %w", ErrInvalidConfig, err)
		}
		dsn := strings.TrimSpace(string(b))
		if dsn == "" {
			return "", fmt.Errorf("%w: no PostgreSQL DSN: the DSN file %s is empty", ErrInvalidConfig, c.DSNFile)
		}
		return dsn, nil
	}
	env := c.dsnEnv()
	dsn := strings.TrimSpace(os.Getenv(env))
	if dsn == "" {
		return "", fmt.Errorf("%w: no PostgreSQL DSN: $%s is empty or unset (or name a file with --leader-elect-dsn-file)", ErrInvalidConfig, env)
	}
	return dsn, nil
}

// dsnEnv is DSNEnv, or its default.
func (c *Config) dsnEnv() string {
	if c.DSNEnv != "" {
		return c.DSNEnv
	}
	return defaultDSNEnv
}

// dsnSource names where the DSN comes from (never its content), for errors.
func (c *Config) dsnSource() string {
	if c.DSNFile != "" {
		return "file " + c.DSNFile
	}
	return "$" + c.dsnEnv()
}

// defaultConfig returns leader election off, resource lock "leases" (the
// controller-runtime and kubebuilder default) and client-go's default
// timings (15s/10s/2s): the defaults of the --leader-elect* flags.
func defaultConfig() Config {
	return Config{LeaderElectionConfiguration: config.LeaderElectionConfiguration{
		LeaderElect:   false,
		LeaseDuration: metav1.Duration{Duration: defaultLeaseDuration},
		RenewDeadline: metav1.Duration{Duration: defaultRenewDeadline},
		RetryPeriod:   metav1.Duration{Duration: defaultRetryPeriod},
		ResourceLock:  rl.LeasesResourceLock,
	}}
}

// usesPgLease reports whether the resource lock involves a pg_lease key.
func (c *Config) usesPgLease() bool {
	return c.ResourceLock == resourceLockPgLease || c.ResourceLock == resourceLockMigration
}

// pgLeaseKey is the pg_lease key: Config.Key, else "namespace/name".
func (c *Config) pgLeaseKey() string {
	if c.Key != "" {
		return c.Key
	}
	return c.ResourceNamespace + "/" + c.ResourceName
}

// validate checks c with component-base's own validation
// (ValidateLeaderElectionConfiguration: client-go's rules for the elector),
// the resource lock name and the handover. Every error names
// the field (field paths under fldPath, e.g. leaderElection.renewDeadline)
// and wraps ErrInvalidConfig. A disabled election (LeaderElect false) is
// always valid. The timings against the TTL of the pg_lease locks are
// resourcelock.New's to check (lockError names them).
func (c *Config) validate(fldPath *field.Path) error {
	if !c.LeaderElect {
		return nil
	}
	errs := cbvalidation.ValidateLeaderElectionConfiguration(&c.LeaderElectionConfiguration, fldPath)
	switch c.ResourceLock {
	case rl.LeasesResourceLock, resourceLockPgLease, resourceLockMigration:
	case "":
		// component-base reported it as required.
	default:
		errs = append(errs, field.NotSupported(fldPath.Child("resourceLock"), c.ResourceLock,
			[]string{rl.LeasesResourceLock, resourceLockPgLease, resourceLockMigration}))
	}
	errs = append(errs, c.validateHandover(fldPath)...)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errs.ToAggregate())
}

// lockError is resourcelock.New's error for the lock c describes, with its
// complaints about the TTL and the timings (resourcelock.Timing's rule)
// named as the fields they came from, leaseDuration and renewDeadline under
// fldPath (validate already refused a retryPeriod that is not positive);
// then it wraps ErrInvalidConfig, and New's other complaints follow as
// they are. An error without such a complaint is returned as it is.
func (c *Config) lockError(err error, fldPath *field.Path) error {
	var errs field.ErrorList
	var rest []error
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			var fe *resourcelock.FieldError
			switch {
			case !errors.As(e, &fe):
				rest = append(rest, e)
			case fe.Field == "LeaseDuration":
				errs = append(errs, field.Invalid(fldPath.Child("leaseDuration"), c.LeaseDuration.Duration.String(), fe.Error()))
			case fe.Field == "RenewDeadline":
				errs = append(errs, field.Invalid(fldPath.Child("renewDeadline"), c.RenewDeadline.Duration.String(), fe.Error()))
			default:
				rest = append(rest, e)
			}
		}
	}
	if len(errs) == 0 {
		return err
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(append([]error{errs.ToAggregate()}, rest...)...))
}
