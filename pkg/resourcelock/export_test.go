package resourcelock

import (
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// TermOf is l's live term, or nil.
func TermOf(l *Lock) *lease.Term { return l.liveTerm() }

// WithMargin sets the term margin (lease.CheckMargin); users keep the
// default.
func WithMargin(d time.Duration) Option { return withMargin(d) }
