package ctrlmetrics_test

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/pglease/pg_lease/pkg/elector/ctrlmetrics"
)

func TestRegistersWithControllerRuntime(t *testing.T) {
	m, err := ctrlmetrics.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctrlmetrics.New(); err != nil {
		t.Fatalf("second New: %v", err)
	}
	m.Leader("k").Set(1)
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "pg_lease_elector_leader" && len(mf.Metric) == 1 && mf.Metric[0].GetGauge().GetValue() == 1 {
			found = true
		}
	}
	if !found {
		t.Error("pg_lease_elector_leader{key=\"k\"} 1 not found in metrics.Registry")
	}
}
