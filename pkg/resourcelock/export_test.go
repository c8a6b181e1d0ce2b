package resourcelock

import "github.com/pglease/pg_lease/pkg/lease"

// TermOf is l's live term, or nil.
func TermOf(l *Lock) *lease.Term { return l.liveTerm() }
