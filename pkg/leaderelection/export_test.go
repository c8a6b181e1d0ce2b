package leaderelection

import (
	"github.com/pglease/pg_lease/pkg/resourcelock"
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
