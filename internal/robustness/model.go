package robustness

import (
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/anishathalye/porcupine"
)

// The single-key model for porcupine: the row of lease.leases for one key,
// with the expiry kept as an interval [ExpLo, ExpHi] of raw server time
// (microseconds) where the history does not pin it down (after an operation
// with an unknown outcome).
//
// Time-dependent decisions are modelled with the server's own timestamps:
// a fresh grant's decision time is exactly expires_at - ttl (the server sets
// expires_at = now + ttl), a renewal's likewise; other decisions happened
// at some server time in [T0, T1], the clock readings taken in the same
// statement before and after the lease function. The model compares those
// raw server times with the stored expiry exactly as the server does, so it
// stays valid when the server clock steps (a step only changes what "now"
// is, and the stored expiry is never rewritten because time passed). The one
// thing a step breaks is the bracket: an operation that overlapped a clock
// step gets [-inf, +inf] instead of [T0, T1].
type kstate struct {
	Exists       bool
	Owner        string // "" = free
	Epoch        int64
	ExpLo, ExpHi int64
	LOwner       string // lapsed_owner / lapsed_epoch (meaningful while Owner != "")
	LEpoch       int64
}

const (
	negInf = math.MinInt64
	posInf = math.MaxInt64
)

// mop is an operation as the model sees it.
type mop struct {
	*Op
	b0, b1 int64 // bracket of the decision's server time
	// busy: a wait-0 denial or a timeout that may have found the key's row
	// locked by another operation (locksRow, mayBlock): it may answer the
	// lock rather than a holder (see Check, "Busy denials").
	busy bool
	// grace: a denial or timeout that may have met a grace recorded by a
	// server life, its end moved later by a backward step of the server's
	// clock (classifyGrace): no new grant of any key, nor a holder's grant
	// of an earlier life, until it ends.
	grace bool
	// bases: every epoch base (epoch >> baseBits) the history observed, in
	// ascending order (see freshEpochOK).
	bases []int64
}

// baseBits: pg_lease's epoch bases are multiples of 2^24: era * 2^40 (a
// promotion, 0.3.0) + restarts * 2^24 (a restart of the server, 0.5.0).
const baseBits = 24

// freshEpochOK: a fresh grant's epoch is the key's counter + 1 (1 for a key
// without a row) or, after a restart or a promotion moved the epoch base
// above the counter, the base + 1: max(counter, base) + 1.
func freshEpochOK(s kstate, epoch int64) bool {
	var counter int64
	if s.Exists {
		counter = s.Epoch
	}
	if epoch == counter+1 {
		return true
	}
	return epoch&(1<<baseBits-1) == 1 && epoch>>baseBits > counter>>baseBits
}

func (s kstate) held(by string) bool { return s.Exists && s.Owner != "" && s.Owner == by }

// holderStatus: every status that lease._holder_status could have returned
// for (owner, epoch) at some now in [b0, b1], and for each the state
// narrowed by what that status implies about the expiry.
func holderStatus(s kstate, owner string, epoch int64, b0, b1 int64) map[string]kstate {
	out := map[string]kstate{}
	if !s.Exists || s.Owner == "" {
		out[SNotOwner] = s
		return out
	}
	if s.Owner != owner {
		if s.LOwner == owner && s.LEpoch == epoch {
			out[SLapsed] = s
		} else {
			out[SNotOwner] = s
		}
		return out
	}
	// Owner matches: lapsed if expiry <= now, for some now <= b1.
	if s.ExpLo <= b1 {
		n := s
		n.ExpHi = min(n.ExpHi, b1)
		out[SLapsed] = n
	}
	if s.ExpHi > b0 { // expiry > now >= b0 possible
		n := s
		n.ExpLo = max(n.ExpLo, b0+1)
		if s.Epoch != epoch {
			out[SEpochMismatch] = n
		} else {
			out[SOk] = n
		}
	}
	return out
}

func grantFresh(s kstate, owner string, epoch, exp, d int64) (kstate, bool) {
	if !freshEpochOK(s, epoch) {
		return s, false
	}
	// Not held at d: free, or its expiry <= d.
	if s.Exists && s.Owner != "" && s.ExpLo > d {
		return s, false
	}
	n := kstate{Exists: true, Owner: owner, Epoch: epoch, ExpLo: exp, ExpHi: exp}
	if s.Exists && s.Owner != "" {
		n.LOwner, n.LEpoch = s.Owner, s.Epoch
	}
	return n, true
}

func unknownExpiry(s kstate) kstate {
	s.ExpLo, s.ExpHi = negInf, posInf
	return s
}

// step returns every state the operation can lead to from s (none: the
// operation cannot be linearized here).
func step(s kstate, o mop) []kstate {
	var out []kstate
	switch o.Kind {
	case KAcquire, KAcquireWait:
		switch {
		case o.Outcome == Fail:
			return []kstate{s}
		case o.Outcome == Unknown:
			out = append(out, s) // no effect (or idempotent)
			// Or a fresh grant: its decision may have come at any later
			// server time (a request can reach the server as its
			// connection is cut), so also after the current grant,
			// the caller's own included, lapsed.
			want := s.Epoch + 1
			if !s.Exists {
				want = 1
			}
			if n, ok := grantFresh(s, o.Owner, want, 0, posInf); ok {
				out = append(out, unknownExpiry(n))
			}
			// (or above a later base the history saw: after a restart)
			for _, b := range o.bases {
				if b > (want-1)>>baseBits {
					if n, ok := grantFresh(s, o.Owner, b<<baseBits+1, 0, posInf); ok {
						out = append(out, unknownExpiry(n))
					}
				}
			}
			return out
		case o.Status == SGranted:
			d := o.Expires - o.TTL
			if d >= o.b0 && d <= o.b1 {
				if n, ok := grantFresh(s, o.Owner, o.OutEpoch, o.Expires, d); ok {
					out = append(out, n)
				}
			}
			// Idempotent: already held by this owner, same epoch and expiry.
			if s.held(o.Owner) && s.Epoch == o.OutEpoch && o.Expires >= s.ExpLo && o.Expires <= s.ExpHi && o.Expires > o.b0 {
				n := s
				n.ExpLo, n.ExpHi = o.Expires, o.Expires
				out = append(out, n)
			}
			return out
		case o.grace && (o.Status == SDenied || o.Status == STimeout):
			return []kstate{s} // withheld by a grace: no effect, in every state
		case o.busy && (o.Status == SDenied || o.Status == STimeout):
			// Busy-possible: the answer to a locked row or to a holder. The
			// unlocked read that precedes every lock saw either a holder
			// other than the caller or a key not held at all; only "held by
			// the caller" (an idempotent grant) is excluded. No effect.
			if s.held(o.Owner) {
				if s.ExpLo > o.b1 {
					return nil
				}
				n := s
				n.ExpHi = min(n.ExpHi, o.b1)
				return []kstate{n}
			}
			return []kstate{s}
		case o.Status == SDenied || o.Status == STimeout:
			if s.Exists && s.Owner != "" && s.Owner != o.Owner && s.ExpHi > o.b0 {
				n := s
				if o.Status == SDenied {
					n.ExpLo = max(n.ExpLo, o.b0+1)
				}
				out = append(out, n)
			}
			return out
		}
	case KRenew:
		if o.Outcome == Fail {
			return []kstate{s}
		}
		if o.Outcome == Unknown {
			out = append(out, s)
			if s.held(o.Owner) && s.Epoch == o.Epoch {
				out = append(out, unknownExpiry(s))
			}
			return out
		}
		b0, b1 := o.b0, o.b1
		if o.Status == SOk {
			d := o.Expires - o.TTL
			if d < b0 || d > b1 {
				return nil
			}
			b0, b1 = d, d
		}
		n, ok := holderStatus(s, o.Owner, o.Epoch, b0, b1)[o.Status]
		if !ok {
			return nil
		}
		if o.Status == SOk {
			n.ExpLo, n.ExpHi = o.Expires, o.Expires
		}
		return []kstate{n}
	case KRelease:
		if o.Outcome == Fail {
			return []kstate{s}
		}
		released := func(s kstate) kstate {
			return kstate{Exists: true, Epoch: s.Epoch + 1}
		}
		if o.Outcome == Unknown {
			out = append(out, s)
			if s.held(o.Owner) && s.Epoch == o.Epoch {
				out = append(out, released(s))
			}
			return out
		}
		n, ok := holderStatus(s, o.Owner, o.Epoch, o.b0, o.b1)[o.Status]
		if !ok {
			return nil
		}
		if o.Status == SOk {
			n = released(n)
		}
		return []kstate{n}
	case KInspect:
		if o.Outcome != OK {
			return []kstate{s}
		}
		switch o.Status {
		case SAbsent:
			if !s.Exists {
				return []kstate{s}
			}
		case SHeld:
			if s.Exists && s.Owner == o.OutOwner && s.Owner != "" && s.Epoch == o.OutEpoch &&
				o.Expires >= s.ExpLo && o.Expires <= s.ExpHi && o.Expires > o.b0 {
				n := s
				n.ExpLo, n.ExpHi = o.Expires, o.Expires
				return []kstate{n}
			}
		case SFree:
			if s.Exists && s.Epoch == o.OutEpoch && (s.Owner == "" || s.ExpLo <= o.b1) {
				n := s
				if n.Owner != "" {
					n.ExpHi = min(n.ExpHi, o.b1)
				}
				return []kstate{n}
			}
		}
		return nil
	}
	return nil
}

func fmtMicros(us int64) string {
	switch us {
	case negInf:
		return "-inf"
	case posInf:
		return "+inf"
	}
	return time.UnixMicro(us).UTC().Format("15:04:05.000000")
}

func (s kstate) String() string {
	if !s.Exists {
		return "no row"
	}
	if s.Owner == "" {
		return fmt.Sprintf("free counter=%d", s.Epoch)
	}
	return fmt.Sprintf("owner=%s epoch=%d expires in [%s, %s] lapsed=%s/%d", s.Owner, s.Epoch,
		fmtMicros(s.ExpLo), fmtMicros(s.ExpHi), s.LOwner, s.LEpoch)
}

// leaseModel is the porcupine model of one key (histories are partitioned
// by key before checking).
func leaseModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{kstate{}} },
		Step: func(state, input, output interface{}) []interface{} {
			var out []interface{}
			for _, n := range step(state.(kstate), input.(mop)) {
				out = append(out, n)
			}
			return out
		},
		Equal: func(a, b interface{}) bool { return a.(kstate) == b.(kstate) },
		DescribeOperation: func(input, output interface{}) string {
			return describeOp(input.(mop).Op)
		},
		DescribeState: func(state interface{}) string { return state.(kstate).String() },
		Hash: func(state interface{}) uint64 {
			s := state.(kstate)
			h := fnv.New64a()
			fmt.Fprintf(h, "%t|%s|%d|%d|%d|%s|%d", s.Exists, s.Owner, s.Epoch, s.ExpLo, s.ExpHi, s.LOwner, s.LEpoch)
			return h.Sum64()
		},
	}
	return nm.ToModel()
}
