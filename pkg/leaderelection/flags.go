package leaderelection

import (
	goflag "flag"
	"sync"

	"github.com/spf13/pflag"
	"k8s.io/component-base/config/options"
)

// Flag names this package adds to component-base's --leader-elect* flags.
const (
	flagDSNFile = "leader-elect-dsn-file"
	flagDSNEnv  = "leader-elect-dsn-env"
	flagKey     = "leader-elect-pglease-key"
)

// Flags is a Config bound to command-line flags: the --leader-elect* flags
// exactly as component-base binds them (options.BindLeaderElectionFlags,
// the flags of kube-controller-manager and kube-scheduler), plus
// --leader-elect-dsn-file, --leader-elect-dsn-env and
// --leader-elect-pglease-key. No flag takes a DSN: the DSN is read from the
// file or the environment variable when the lock is built.
type Flags struct {
	// Config holds the flag values once the flag set is parsed.
	Config Config

	mu  sync.Mutex
	set map[string]bool // flags given on the command line
	own map[string]bool // flags this Flags bound (others were defined already)
}

// BindFlags binds the flags into a standard library flag set (the
// flag.CommandLine of a kubebuilder main.go) and returns them. A flag the
// set already defines is left alone: a kubebuilder scaffold defines
// --leader-elect itself (as enableLeaderElection, which it passes as
// manager.Options.LeaderElection), and Flags.NewManager then takes that
// value from the options.
//
// A pflag (cobra) program binds them on a standard flag set and adds that
// to its own: pflagSet.AddGoFlagSet(goflagSet) after BindFlags(goflagSet).
func BindFlags(fs *goflag.FlagSet) *Flags {
	f := &Flags{Config: defaultConfig(), set: map[string]bool{}, own: map[string]bool{}}
	f.pflags().VisitAll(func(pf *pflag.Flag) {
		if fs.Lookup(pf.Name) != nil {
			return
		}
		f.own[pf.Name] = true
		fs.Var(pf.Value, pf.Name, pf.Usage)
	})
	return f
}

// pflags builds the flags on a private pflag set, each value wrapped so that
// Flags learns which were set.
func (f *Flags) pflags() *pflag.FlagSet {
	pfs := pflag.NewFlagSet("leader-elect", pflag.ContinueOnError)
	options.BindLeaderElectionFlags(&f.Config.LeaderElectionConfiguration, pfs)
	pfs.StringVar(&f.Config.DSNFile, flagDSNFile, "",
		"File holding the PostgreSQL connection string of the pg_lease lock (resource locks pglease and leases+pglease), "+
			"e.g. a mounted Secret key. Takes precedence over --"+flagDSNEnv+".")
	pfs.StringVar(&f.Config.DSNEnv, flagDSNEnv, defaultDSNEnv,
		"Name of the environment variable holding the PostgreSQL connection string of the pg_lease lock.")
	pfs.StringVar(&f.Config.Key, flagKey, "",
		"The pg_lease key (default <resource-namespace>/<resource-name>).")
	pfs.StringVar(&f.Config.Handover, flagHandover, "",
		"pglease only: hand the key over on release to the ready candidate this strategy chooses: "+
			"priority, newest-version or oldest-version (default: none, the followers race).")
	pfs.StringVar(&f.Config.Version, flagVersion, "",
		"This candidate's semantic version for --"+flagHandover+" newest-version and oldest-version "+
			"(default: the binary's module version).")
	if rl := pfs.Lookup("leader-elect-resource-lock"); rl != nil {
		rl.Usage = "The type of resource object that is used for locking during leader election. " +
			"Supported options are 'leases' (a coordination.k8s.io Lease), 'pglease' (a pg_lease key in PostgreSQL) " +
			"and 'leases+pglease' (both, for migrating from leases to pglease)."
	}
	pfs.VisitAll(func(pf *pflag.Flag) {
		pf.Value = &trackedValue{Value: pf.Value, name: pf.Name, f: f}
	})
	return pfs
}

// isSet reports whether the flag was given on the command line.
func (f *Flags) isSet(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.set[name]
}

// bound reports whether this Flags defined the flag.
func (f *Flags) bound(name string) bool { return f.own[name] }

// trackedValue records that its flag was set; it is a pflag.Value and a
// flag.Value (with IsBoolFlag, so that a bare -leader-elect works).
type trackedValue struct {
	pflag.Value
	name string
	f    *Flags
}

func (v *trackedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return err
	}
	v.f.mu.Lock()
	v.f.set[v.name] = true
	v.f.mu.Unlock()
	return nil
}

func (v *trackedValue) IsBoolFlag() bool { return v.Value.Type() == "bool" }

// String is safe on a zero value (the flag package calls it on one to find
// out whether a default is worth printing).
func (v *trackedValue) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}
