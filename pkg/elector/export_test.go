package elector

import "github.com/prometheus/client_golang/prometheus"

// ConfigOf is the configuration in effect, defaults filled in.
func ConfigOf(e *Elector) Config { return e.cfg }

// ErrorsOf is the errors counter of key and kind.
func ErrorsOf(m *Metrics, key, kind string) prometheus.Counter {
	return m.errors.WithLabelValues(key, kind)
}

// LeaderOf is the leader gauge of key.
func LeaderOf(m *Metrics, key string) prometheus.Gauge { return m.leader.WithLabelValues(key) }

// EpochOf is the epoch gauge of key.
func EpochOf(m *Metrics, key string) prometheus.Gauge { return m.epoch.WithLabelValues(key) }

// TransitionsOf is the transitions counter of key and transition.
func TransitionsOf(m *Metrics, key, transition string) prometheus.Counter {
	return m.transitions.WithLabelValues(key, transition)
}
