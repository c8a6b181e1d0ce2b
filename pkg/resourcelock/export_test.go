package resourcelock

import (
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// TermOf is l's live term, or nil.
func TermOf(l *Lock) *lease.Term { return l.liveTerm() }

// WithMargin returns o with the term margin (lease.CheckMargin) set to d;
// users keep the default.
func WithMargin(o Options, d time.Duration) Options { o.margin = d; return o }

// LeaseDuration is the TTL l sends (Options.LeaseDuration or the default).
func LeaseDuration(l *Lock) time.Duration { return l.opts.leaseDuration }
