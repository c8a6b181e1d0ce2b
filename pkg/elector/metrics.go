package elector

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pg_lease/pkg/internal/promreg"
)

// Error kinds counted by the errors metric (label "kind").
const (
	errorKindAcquire       = "acquire"        // an acquire call failed (connection, timeout, server error)
	errorKindInspect       = "inspect"        // a follower's read of the key failed
	errorKindRenew         = "renew"          // a renew call failed without a verdict (connection, timeout)
	errorKindRelease       = "release"        // a release call failed
	errorKindLapsed        = "lapsed"         // a renewal was answered lapsed
	errorKindNotOwner      = "not_owner"      // a renewal was answered not_owner
	errorKindEpochMismatch = "epoch_mismatch" // a renewal was answered epoch_mismatch
	errorKindDeadline      = "deadline"       // renewals failed until the local deadline
	errorKindRegister      = "register"       // a candidate registration failed
	errorKindIdentityTaken = "identity_taken" // the key is held under this identity by another session
)

// metrics are an elector's Prometheus metrics, labelled by lease key (the
// series are listed at Config.Registerer).
type metrics struct {
	leader      *prometheus.GaugeVec
	epoch       *prometheus.GaugeVec
	renew       *prometheus.HistogramVec
	transitions *prometheus.CounterVec
	errors      *prometheus.CounterVec
}

// newMetrics creates the metrics and registers them with reg (nil: not
// registered). If reg already holds collectors of the same description
// (another elector's on the same registry), those are reused.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pg_lease_elector_leader",
			Help: "1 while this process leads the key, else 0.",
		}, []string{"key"}),
		epoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pg_lease_elector_epoch",
			Help: "Fencing epoch of the term this process leads for the key; 0 when not leading.",
		}, []string{"key"}),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pg_lease_elector_renew_duration_seconds",
			Help:    "Latency of lease renew calls, successful or not.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"key"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pg_lease_elector_transitions_total",
			Help: "Leadership transitions of this process: transition=started or stopped.",
		}, []string{"key", "transition"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pg_lease_elector_errors_total",
			Help: "Elector failures by kind (acquire, inspect, renew, release, register, lapsed, not_owner, epoch_mismatch, deadline, identity_taken).",
		}, []string{"key", "kind"}),
	}
	var err error
	m.leader = promreg.Register(reg, m.leader, &err)
	m.epoch = promreg.Register(reg, m.epoch, &err)
	m.renew = promreg.Register(reg, m.renew, &err)
	m.transitions = promreg.Register(reg, m.transitions, &err)
	m.errors = promreg.Register(reg, m.errors, &err)
	if err != nil {
		return nil, fmt.Errorf("elector: registering metrics: %w", err)
	}
	return m, nil
}
