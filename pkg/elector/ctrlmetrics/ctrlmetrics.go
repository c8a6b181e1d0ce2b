// Package ctrlmetrics registers the elector's metrics with
// controller-runtime's global registry (sigs.k8s.io/controller-runtime's
// metrics.Registry), which a controller-runtime manager serves on its
// metrics endpoint. It is a package of its own so that pkg/elector does not
// depend on controller-runtime.
package ctrlmetrics

import (
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/pglease/pg_lease/pkg/elector"
)

// New returns elector metrics registered with metrics.Registry; pass them
// as elector.Config.Metrics. Calling it again returns metrics sharing the
// same collectors.
func New() (*elector.Metrics, error) {
	return elector.NewMetrics(metrics.Registry)
}
