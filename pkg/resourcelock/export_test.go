package resourcelock

import (
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// TermOf is l's live term, or nil.
func TermOf(l *Lock) *lease.Term { return l.liveTerm() }

// LeaseDuration is the TTL l sends (Config.LeaseDuration or the default).
func LeaseDuration(l *Lock) time.Duration { return l.cfg.LeaseDuration }

// MarginOf is the lock's configured Margin.
func MarginOf(l *Lock) time.Duration { return l.cfg.Margin }
