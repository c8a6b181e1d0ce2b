package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func counter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_total", Help: "h"}, []string{"key"})
}

// A second registration of an equal collector returns the first, so both
// users count into one series; a nil registry registers nothing.
func TestRegisterReusesTheRegisteredCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	var err error
	first := Register(reg, counter(), &err)
	second := Register(reg, counter(), &err)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatal("the second registration did not return the registered collector")
	}
	if c := counter(); Register(nil, c, &err) != c || err != nil {
		t.Fatalf("nil registry: %v", err)
	}
}

// A collector of another type under the same name is an error, kept in
// *errp; later calls then register nothing.
func TestRegisterKeepsTheFirstError(t *testing.T) {
	reg := prometheus.NewRegistry()
	var err error
	Register(reg, counter(), &err)
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "t_total", Help: "h"}, []string{"key"})
	Register(reg, g, &err)
	if err == nil {
		t.Fatal("a gauge under a counter's name was accepted")
	}
	first := err
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "u_total", Help: "h"})
	Register(reg, other, &err)
	if err != first {
		t.Fatalf("error changed to %v", err)
	}
	if reg.Unregister(other) {
		t.Fatal("registered after an error")
	}
}
