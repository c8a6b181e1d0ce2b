package ctrlmetrics_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
	_ = m
	// The elector's gauge is registered with controller-runtime's registry:
	// registering another collector of the same description is refused.
	dup := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pg_lease_elector_leader",
		Help: "1 while this process leads the key, else 0.",
	}, []string{"key"})
	var are prometheus.AlreadyRegisteredError
	if err := metrics.Registry.Register(dup); !errors.As(err, &are) {
		t.Errorf("pg_lease_elector_leader not registered in metrics.Registry: %v", err)
	}
}
