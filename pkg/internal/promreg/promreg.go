// Package promreg registers the Prometheus collectors of the packages
// under pkg/, all in one way.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns the collector to use. When reg
// already holds an equal collector of the same type (another elector's or
// lock's on the same registry), it returns that one, so that every user of
// reg counts into the same series. A nil reg registers nothing. The first
// failure is kept in *errp; once *errp is set, Register does nothing.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	if reg == nil || *errp != nil {
		return c
	}
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errp = err
	return c
}
