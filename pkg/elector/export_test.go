package elector

import "github.com/prometheus/client_golang/prometheus"

// ConfigOf is the configuration in effect, defaults filled in.
func ConfigOf(e *Elector) Config { return e.cfg }

// ErrorsOf is e's errors counter of key and kind.
func ErrorsOf(e *Elector, key, kind string) prometheus.Counter {
	return e.metrics.errors.WithLabelValues(key, kind)
}

// LeaderOf is e's leader gauge of key.
func LeaderOf(e *Elector, key string) prometheus.Gauge { return e.metrics.leader.WithLabelValues(key) }

// EpochOf is e's epoch gauge of key.
func EpochOf(e *Elector, key string) prometheus.Gauge { return e.metrics.epoch.WithLabelValues(key) }

// TransitionsOf is e's transitions counter of key and transition.
func TransitionsOf(e *Elector, key, transition string) prometheus.Counter {
	return e.metrics.transitions.WithLabelValues(key, transition)
}
