package leaderelection

import (
	"context"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Flag names of the handover option.
const (
	flagHandover = "leader-elect-handover"
	flagVersion  = "leader-elect-version"
)

// handoverStrategies are the values of Config.Handover.
var handoverStrategies = []string{"any", "priority", "newest-version", "oldest-version"}

// candidacy returns the pg_lease Candidacy that Config.Handover asks for,
// or nil (no handover: a release frees the key for the race). ready may be
// nil (always ready).
func (c *Config) candidacy(ready func() bool) *handover.Candidacy {
	if c.Handover == "" || c.Handover == "any" || !c.usesPgLease() {
		return nil
	}
	s, err := handover.ParseStrategy(c.Handover)
	if err != nil {
		return nil // validate reported it
	}
	return &handover.Candidacy{Strategy: s, Version: c.candidateVersion(), Ready: ready}
}

// candidateVersion is Config.Version, else the main module's version when
// the binary was built from a tagged module (not "(devel)").
func (c *Config) candidateVersion() string {
	if c.Version != "" {
		return c.Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return ""
}

// validateHandover checks Handover and, for the version strategies, that a
// version is known.
func (c *Config) validateHandover(fldPath *field.Path) field.ErrorList {
	if c.Handover == "" {
		return nil
	}
	ok := false
	for _, s := range handoverStrategies {
		ok = ok || c.Handover == s
	}
	if !ok {
		return field.ErrorList{field.NotSupported(fldPath.Child("handover"), c.Handover, handoverStrategies)}
	}
	if (c.Handover == "newest-version" || c.Handover == "oldest-version") && c.candidateVersion() == "" {
		return field.ErrorList{field.Required(fldPath.Child("version"),
			"handover "+c.Handover+" needs this candidate's semantic version (--"+flagVersion+")")}
	}
	if err := handover.CheckVersion(c.candidateVersion()); err != nil {
		return field.ErrorList{field.Invalid(fldPath.Child("version"), c.candidateVersion(), err.Error())}
	}
	return nil
}

// cacheReady is a candidate's readiness for a manager: ready once the
// manager's caches have synced, so that a handed-over leader starts with
// warm caches. mgr is set once the manager exists.
func cacheReady(mgr *atomic.Pointer[manager.Manager]) func() bool {
	return func() bool {
		m := mgr.Load()
		if m == nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		return (*m).GetCache().WaitForCacheSync(ctx)
	}
}
