package robustness

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is one broken rule, with the operations (IDs) that show it.
type Violation struct {
	Rule string // I1, I2, I3, I9, I11, FENCE, LIN
	Key  string
	Msg  string
	Ops  []int
}

func (v Violation) String() string {
	return fmt.Sprintf("%s key %s: %s (ops %v)", v.Rule, v.Key, v.Msg, v.Ops)
}

// Result is what Check found.
type Result struct {
	Violations []Violation
	// Linearizability per key: Ok, Illegal or Unknown (timed out).
	Linearizable map[string]porcupine.CheckResult
	// Counts.
	OpsByKind     map[string]map[string]int // kind -> outcome/status -> n
	FaultsByKind  map[string]int
	Grants        int // distinct (key, epoch) grants observed
	FreshGrants   int // grants whose deciding acquire was observed
	I1Pairs       int // pairs of grants compared for overlap
	I1Skipped     int // pairs not compared (clock step in between with unknown renewals, ...)
	UnknownOps    int
	UnboundedOps  int // unknown, and the backend was not seen gone
	LooseBrackets int // operations that overlapped a clock step
	// FailoverMode: the history has failover faults, so only the rules
	// that hold across a promotion were checked (see Check).
	FailoverMode bool
	// Denials: acquire denials (wait 0) and acquire_wait timeouts;
	// GraceDenials: those of them modelled as grace-possible (classifyGrace).
	GraceDenials int
	// BusyDenials: those of them modelled as busy-possible (see Check).
	Denials     int
	BusyDenials int
	busy        map[int]bool // op IDs of the busy-possible ones (for Report)
	grace       map[int]bool // op IDs of the grace-possible ones (for Report)
	// RenewAfterRelease: failover runs, renewals reported ok for a token
	// its owner had released (the release lost with the old primary); not
	// taken as the owner's belief by I1.
	RenewAfterRelease int
}

// CheckOptions tune Check.
type CheckOptions struct {
	// LinTimeout bounds porcupine per key; zero: 60 s; negative: skip.
	LinTimeout time.Duration
}

// Rules (every time comparison is either between two raw server times that
// the server itself compares, or between local CLOCK_MONOTONIC readings):
//
//   - Raw server time. The server decides with clock_timestamp() against the
//     stored expires_at and never rewrites a row because time passed, so
//     comparing a decision time with a stored expiry is valid even across a
//     clock step. A decision time is known exactly for a fresh grant and a
//     renewal (expires_at - ttl); for other operations only the bracket
//     [T0, T1] of the same statement is known, and only if no clock step
//     overlapped the operation (else the operation is "loose" and rules that
//     need its bracket skip it). Comparing two clock readings of different
//     statements is done only where no backward step lies between them.
//   - Real time. a precedes b when a's response (local) came before b's
//     invocation (local). An unknown operation's Return is when its backend
//     was seen gone (the client terminates it and waits), or Never.
//
// I1 (single winner), for grants g < h of a key (by epoch) where h's
// deciding acquire was observed (fresh: d_h = expires - ttl lies in its
// bracket and the bracket is valid; see classifyFresh), with E_g the
// expiry set by the last definite acquire/renew of g in its holder's
// program order: a violation if d_h < E_g and g was not ended before d_h,
// where g ends by a release r (ok or unknown) only if r was invoked before
// h's response, and, for r ok with no backward step between r and h,
// d_h >= r.T0. The pair is compared when h took over directly (h.epoch =
// g.epoch + 1: the server compared d_h with g's stored expiry, valid
// whatever the clock did) or when no backward step lies between E_g's
// operation and h; pairs where an unknown renewal of g follows E_g's
// operation with a backward step between are skipped too (counted).
//
// I2/I3 (epochs), per key: every definite operation observes the key's epoch
// counter (acquire granted E: E; renew/release ok e: e, and e+1 after a
// release; inspect: its epoch; inspect absent: 0). If a precedes b in real
// time, b must observe at least what a left. A fresh grant must be strictly
// above it. One (key, epoch) has one owner across every observation.
//
// I9: a renew/release reported ok must come from the epoch's owner, must
// not follow (in real time) an observation of a higher epoch, and a renewal
// must decide before the grant's expiry (d < E_prev, with E_prev set by the
// holder's previous definite operation and no unknown one between); a
// release's bracket must start before it.
//
// I11: inspect held (O, E, X) must agree with the owner of E, and X must be
// the expiry set by O's last definite operation on E when nothing of O's ran
// concurrently or unknown; inspect not-held with epoch E is a violation if
// the grant E is certainly held then (its last definite expiry > T1).
//
// FENCE: the guard's accepted writes, in the order of its write counter,
// never go down in epoch; no write is accepted after (real time) a write
// with a higher epoch was accepted; a rejection needs a higher-epoch write
// invoked before it returned; the counter is never reused.
//
// LIN: per key, porcupine with the model of model.go.
//
// Busy denials (pg_lease 0.3.0). A non-blocking acquire (wait 0) never
// waits for a row lock: when its unlocked read finds the key free, lapsed
// or absent, it locks the row NOWAIT (a first grant's INSERT waits at most
// 1 ms for a concurrent uncommitted first grant) and answers acquired = f
// if another transaction has it locked; an acquire_wait times out (57014)
// when the row stays locked for its whole wait. So a denial or a timeout
// no longer implies "held by another owner": it may be "busy". A denial or
// timeout d is busy-possible when some operation l on the same key that can
// lock the key's row (locksRow) may have held that lock while d tried
// (mayBlock): their intervals [Call, Return] overlap in real time (a lock
// is taken and let go inside the statement, which ends before the response,
// or before the backend is seen gone for an unknown outcome) and, where
// both brackets are valid, l's statement read its first clock (T0) no later
// than d's read its last (T1), and a renew or release that did not answer
// ok (its lock goes with the subtransaction that took it, inside the
// function) read its last clock no earlier than d's first. Lockers: acquire
// and acquire_wait that granted (not idempotently), or have an unknown or
// failed outcome; renew and release whatever they answered; a denial or a
// timeout only if it overlapped a clock step (see locksRow: otherwise it
// locks only right after a concurrent grant committed, and whatever it
// blocked overlaps that grant). Not lockers: inspect (an unlocked read)
// and the guard write (a plain UPDATE of robustness_guard, which never
// touches lease.leases). The model takes a busy-possible denial or timeout
// as a no-op legal in every state except one where the caller itself
// certainly holds the key through its whole bracket (that would have been
// an idempotent grant); one that is not busy-possible must still be
// explained by a holder other than the caller, as in 0.2.0. No other rule
// uses denials or timeouts: they observe no epoch and name no owner, so
// I1, I2/I3, I9, I11 and FENCE make no "denied => held" assumption.
//
// A history with failover faults (FaultFailover: what the old primary
// acknowledged after its standby was cut off is lost) is checked with the
// rules that hold across a promotion only: I1; of I2/I3, one owner per (key,
// epoch) over every observation, and every fresh grant strictly above
// everything observed before it in real time (the other observations may
// legitimately see the state before a lost tail). I9, I11, FENCE (its guard
// table fails over with the leases) and LIN assume one timeline and are not
// checked (Result.FailoverMode). A renewal reported ok for a token its owner
// had released (possible only when the release was lost) is the client
// acting on a token it gave up: I1 does not take it as the owner's belief
// (Result.RenewAfterRelease counts them); an acquire is never excused.
func Check(h *History, opts CheckOptions) *Result {
	if opts.LinTimeout == 0 {
		opts.LinTimeout = 60 * time.Second
	}
	c := newChecker(h)
	c.count()
	c.classifyFresh()
	c.classifyBusy()
	c.res.busy = c.busyOps
	c.classifyGrace()
	c.res.grace = c.graceOps
	for _, f := range h.Faults {
		if f.Kind == FaultFailover {
			c.failover = true
		}
	}
	c.res.FailoverMode = c.failover
	for _, key := range c.keys {
		c.checkEpochs(key)
		c.checkI1(key)
		if c.failover {
			continue
		}
		c.checkI9(key)
		c.checkI11(key)
		c.checkGuard(key)
	}
	if opts.LinTimeout > 0 && !c.failover {
		for _, key := range c.keys {
			c.checkLin(key, opts.LinTimeout)
		}
	}
	sort.SliceStable(c.res.Violations, func(i, j int) bool {
		a, b := c.res.Violations[i], c.res.Violations[j]
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Key < b.Key
	})
	return c.res
}

type checker struct {
	h      *History
	res    *Result
	keys   []string
	byKey  map[string][]*Op // lease ops (no guard), by Call
	guards map[string][]*Op
	clock  []Fault // clock steps
	seen   map[string]bool

	freshOps map[int]bool
	busyOps  map[int]bool // busy-possible denials and timeouts (see Check)
	graceOps map[int]bool // grace-possible denials and timeouts (classifyGrace)
	failover bool         // the history has failover faults: see Check
	bases    []int64      // the epoch bases observed (mop.bases)
}

func newChecker(h *History) *checker {
	h.Sort()
	c := &checker{h: h, res: &Result{Linearizable: map[string]porcupine.CheckResult{},
		OpsByKind: map[string]map[string]int{}, FaultsByKind: map[string]int{}},
		byKey: map[string][]*Op{}, guards: map[string][]*Op{}, seen: map[string]bool{}}
	keys := map[string]bool{}
	for i := range h.Ops {
		o := &h.Ops[i]
		keys[o.Key] = true
		for _, e := range []int64{o.Epoch, o.OutEpoch} {
			if e > 0 && !slices.Contains(c.bases, e>>baseBits) {
				c.bases = append(c.bases, e>>baseBits)
			}
		}
		if o.Kind == KGuard {
			c.guards[o.Key] = append(c.guards[o.Key], o)
		} else {
			c.byKey[o.Key] = append(c.byKey[o.Key], o)
		}
	}
	for k := range keys {
		c.keys = append(c.keys, k)
	}
	sort.Strings(c.keys)
	slices.Sort(c.bases)
	for _, f := range h.Faults {
		if f.Kind == FaultClock {
			c.clock = append(c.clock, f)
		}
	}
	return c
}

func (c *checker) violate(rule, key, msg string, ops ...*Op) {
	ids := make([]int, 0, len(ops))
	for _, o := range ops {
		ids = append(ids, o.ID)
	}
	sig := fmt.Sprintf("%s|%s|%v", rule, key, ids)
	if c.seen[sig] {
		return
	}
	c.seen[sig] = true
	c.res.Violations = append(c.res.Violations, Violation{Rule: rule, Key: key, Msg: msg, Ops: ids})
}

func (c *checker) count() {
	for i := range c.h.Ops {
		o := &c.h.Ops[i]
		m := c.res.OpsByKind[o.Kind]
		if m == nil {
			m = map[string]int{}
			c.res.OpsByKind[o.Kind] = m
		}
		k := o.Outcome
		if o.Outcome == OK && o.Status != "" {
			k = o.Status
		}
		m[k]++
		if o.Outcome == Unknown {
			c.res.UnknownOps++
			if o.Return == Never {
				c.res.UnboundedOps++
			}
		}
		if c.loose(o) {
			c.res.LooseBrackets++
		}
	}
	for _, f := range c.h.Faults {
		c.res.FaultsByKind[f.Kind]++
	}
}

func ret(o *Op) int64 {
	if o.Outcome == Unknown && o.Return == Never && o.Failed != 0 {
		return Never
	}
	return o.Return
}

// loose: a clock step overlapped the operation, so [T0, T1] may not bracket
// its decision.
func (c *checker) loose(o *Op) bool {
	for _, f := range c.clock {
		if f.Start <= ret(o) && f.End >= o.Call {
			return true
		}
	}
	return false
}

// backStepBetween: a backward clock step overlapped [a, b] (Mono()).
func (c *checker) backStepBetween(a, b int64) bool {
	for _, f := range c.clock {
		if f.OffsetAfter < f.OffsetBefore && f.Start <= b && f.End >= a {
			return true
		}
	}
	return false
}

func definite(o *Op) bool { return o.Outcome == OK }

func sets(o *Op, epoch int64) bool {
	return definite(o) && ((o.Kind == KAcquire || o.Kind == KAcquireWait) && o.Status == SGranted && o.OutEpoch == epoch ||
		o.Kind == KRenew && o.Status == SOk && o.Epoch == epoch)
}

// fresh: o is an acquire that certainly made a new grant (see Check).
func (c *checker) fresh(o *Op) bool { return c.freshOps[o.ID] }

// classifyFresh: an acquire granted E made a new grant, rather than
// returning its owner's current one, when its decision time d =
// expires_at - ttl lies in its bracket [T0, T1] and the bracket is valid
// (no clock step overlapped it). An idempotent re-acquire returns the
// expiry set by an earlier operation of the same owner, whose d' is
// earlier than T0 unless the clock stepped back since; so the bracket test
// alone decides when no backward step came in the 25 s before (TTLs are
// short and |offset| <= 20 s, so a grant not renewed is gone by then).
// Within such a window it decides only if the owner never showed epoch E
// on the key before and made no acquire with an unknown outcome on it in
// those 25 s.
func (c *checker) classifyFresh() {
	const window = int64(25 * time.Second)
	c.freshOps = map[int]bool{}
	for _, ops := range c.byKey {
		shown := map[string]map[int64]bool{}
		lastUnknownAcq := map[string]int64{}
		for _, o := range ops { // by Call: each owner's program order
			if o.Kind == KInspect {
				continue
			}
			isAcq := o.Kind == KAcquire || o.Kind == KAcquireWait
			if isAcq && definite(o) && o.Status == SGranted {
				d := o.Expires - o.TTL
				if d >= o.T0 && d <= o.T1 && !c.loose(o) {
					if !c.backStepBetween(o.Call-window, o.Return) {
						c.freshOps[o.ID] = true
					} else if u, ok := lastUnknownAcq[o.Owner]; !shown[o.Owner][o.OutEpoch] && (!ok || u < o.Call-window) {
						c.freshOps[o.ID] = true
					}
				}
			}
			if isAcq && o.Outcome == Unknown {
				lastUnknownAcq[o.Owner] = o.Call
			}
			if e, owner, ok := grantEvidence(o); ok {
				if shown[owner] == nil {
					shown[owner] = map[int64]bool{}
				}
				shown[owner][e] = true
			}
		}
	}
}

// denial: o answered "not acquired" (acquired = f for wait 0, the timeout
// 57014 for a wait > 0).
func denial(o *Op) bool {
	return definite(o) && (o.Kind == KAcquire && o.Status == SDenied || o.Kind == KAcquireWait && o.Status == STimeout)
}

// locksRow: o may have held a lock on its key's row of lease.leases (or,
// for a first grant, on its uncommitted insertion) that another
// transaction found (c.loose: see below). acquire and acquire_wait keep a
// lock only on their grant path, so a granted, unknown or failed one may
// have. One that answered "not acquired" (denied, timeout) takes a lock
// only when its unlocked read found the key free or lapsed and its locked
// read then found it held: either a grant G committed in between (whoever
// that brief lock made busy had read the key not held before G committed,
// so it overlaps G itself in real time, and G's bracket starts before the
// lock: mayBlock(G, it) holds), or the server clock stepped back in between
// (o is loose): it is a locker only when loose; likewise an idempotent
// grant (decided before its bracket). renew and release are taken as
// lockers whatever they answer (0.5.0 locks the row only when it names their
// owner under their role: a superset, so never a false violation). inspect reads without a
// lock; guard writes only robustness_guard (guard ops are not in byKey).
func (c *checker) locksRow(o *Op) bool {
	switch o.Kind {
	case KAcquire, KAcquireWait:
		if definite(o) && o.Status == SGranted && !c.loose(o) && o.Expires-o.TTL < o.T0 {
			// Idempotent: it returned its owner's grant from the unlocked
			// read, decided before this call (a fresh grant decides inside
			// its bracket); no lasting lock, as for a denial.
			return false
		}
		return !denial(o) || c.loose(o)
	case KRenew, KRelease:
		return true
	}
	return false
}

// classifyBusy: a denial (or timeout) is busy-possible when it overlaps in
// real time an operation on the same key that can lock the row.
func (c *checker) classifyBusy() {
	c.busyOps = map[int]bool{}
	for _, ops := range c.byKey {
		var lockers []*Op
		for _, o := range ops {
			if c.locksRow(o) {
				lockers = append(lockers, o)
			}
		}
		for _, d := range ops {
			if !denial(d) {
				continue
			}
			c.res.Denials++
			for _, l := range lockers {
				if l.Call > ret(d) {
					break // lockers are by Call
				}
				if c.mayBlock(l, d) {
					c.busyOps[d.ID] = true
					c.res.BusyDenials++
					break
				}
			}
		}
	}
}

// classifyGrace: a denial or timeout d is grace-possible when the server's
// clock at d read earlier than an instant a server life may have recorded
// as the end of its grace. A life (the first, and one after each kill
// fault's restart) records it when it first needs it; with no grace to give
// (promotion 'synchronous') it is the life's start or that call's clock,
// and lease._grant_context keeps the latest one across restarts. After a
// backward step of the server's clock that instant lies ahead again, and
// the server withholds every new grant (and a holder's grant of an earlier
// life) until its clock passes it (a step shifts every recorded instant in
// real time by the step). The instant is bounded (graceBound) by a fresh
// grant of the life: the server granted at its decision time, so the
// grace had ended then. A grant handed back to its holder is no bound: a
// grant of the current life goes on during the grace. Before any fresh
// grant the instant is no later than the server's clock at some time of the
// life up to d's call (clockMax), or than the life before's instant, which
// it keeps when later.
func (c *checker) classifyGrace() {
	c.graceOps = map[int]bool{}
	back := int64(-1) // the first backward step: before it, no recorded instant lies ahead
	for _, f := range c.clock {
		if f.OffsetAfter < f.OffsetBefore && (back < 0 || f.Start < back) {
			back = f.Start
		}
	}
	if back < 0 {
		return
	}
	g := c.newGraceBound()
	for _, ops := range c.byKey {
		for _, d := range ops {
			if !denial(d) || d.Call < back {
				continue
			}
			if d.T0 == 0 || d.T0 < g.bound(g.lifeOf(d.Call), d.Call) {
				c.graceOps[d.ID] = true
				c.res.GraceDenials++
			}
		}
	}
}

// graceBound: upper bounds of the instant each server life may have
// recorded as the end of its grace (classifyGrace). Server times in
// microseconds, local times (Mono) in nanoseconds.
type graceBound struct {
	cuts  []int64 // where each life after the first begins (a kill fault's start)
	fresh [][]*Op // per life: its fresh grants, by Return
	// byRet: the clock readings (T1 of answered operations), by Return;
	// minKey[i]: the least key (clockMax) of byRet[:i+1].
	byRet  []*Op
	minKey []int64
	fwd    []Fault       // forward clock steps
	backs  []Fault       // backward clock steps
	past   map[int]int64 // bound(l, cuts[l]): life l's at its end
}

func (c *checker) newGraceBound() *graceBound {
	g := &graceBound{past: map[int]int64{}}
	for _, f := range c.h.Faults {
		if f.Kind == FaultKill {
			g.cuts = append(g.cuts, f.Start)
		}
	}
	slices.Sort(g.cuts)
	for _, f := range c.clock {
		if f.OffsetAfter > f.OffsetBefore {
			g.fwd = append(g.fwd, f)
		} else if f.OffsetAfter < f.OffsetBefore {
			g.backs = append(g.backs, f)
		}
	}
	g.fresh = make([][]*Op, len(g.cuts)+1)
	for i := range c.h.Ops {
		e := &c.h.Ops[i]
		if e.Outcome != OK || e.T1 == 0 {
			continue
		}
		g.byRet = append(g.byRet, e)
		if c.fresh(e) {
			l := g.lifeOf(e.Call)
			g.fresh[l] = append(g.fresh[l], e)
		}
	}
	byReturn := func(a, b *Op) int { return cmp.Compare(a.Return, b.Return) }
	slices.SortStableFunc(g.byRet, byReturn)
	for _, f := range g.fresh {
		slices.SortStableFunc(f, byReturn)
	}
	for i, e := range g.byRet {
		k := e.T1 - e.Call/1000 - g.fwdEndedBefore(e.Call)
		if i > 0 {
			k = min(k, g.minKey[i-1])
		}
		g.minKey = append(g.minKey, k)
	}
	return g
}

func (g *graceBound) lifeOf(t int64) int {
	return sort.Search(len(g.cuts), func(i int) bool { return g.cuts[i] > t })
}

// fwdEndedBefore: the forward steps that ended before t, in µs.
func (g *graceBound) fwdEndedBefore(t int64) int64 {
	var s int64
	for _, f := range g.fwd {
		if f.End < t {
			s += (f.OffsetAfter - f.OffsetBefore) / 1000
		}
	}
	return s
}

// fwdStartedBy: the forward steps that started by t, in µs.
func (g *graceBound) fwdStartedBy(t int64) int64 {
	var s int64
	for _, f := range g.fwd {
		if f.Start <= t {
			s += (f.OffsetAfter - f.OffsetBefore) / 1000
		}
	}
	return s
}

// clockAt: an upper bound of the server's clock at t (local), from the
// operations answered by before (<= t). An operation e read T1 at some
// local time r in [e.Call, e.Return] (its answer may reach the client
// late: a stopped worker); from r to t the clock advanced by t - r at most,
// plus the forward steps that took effect in between (started by t, ended
// after e.Call): T1 + (t - e.Call) + those steps, whose least value over
// the operations is e's key (T1 - e.Call - the steps ended before e.Call)
// + t + the steps started by t. Backward steps only lower the clock.
// math.MaxInt64 when no operation answered by then.
func (g *graceBound) clockAt(t, before int64) int64 {
	i := sort.Search(len(g.byRet), func(i int) bool { return g.byRet[i].Return > before })
	if i == 0 {
		return math.MaxInt64
	}
	return g.minKey[i-1] + t/1000 + g.fwdStartedBy(t)
}

// clockMax: an upper bound of the server's clock over the local interval
// [from, until]: at until, and just before each backward step in it (the
// clock rises between steps).
func (g *graceBound) clockMax(from, until int64) int64 {
	m := g.clockAt(until, until)
	for _, f := range g.backs {
		if f.End >= from && f.Start <= until {
			m = max(m, g.clockAt(f.End, f.Start))
		}
	}
	return m
}

// bound: the latest instant life l may have recorded as the end of its
// grace, as seen by a call at until: a fresh grant of l answered before
// until granted at its decision time, so the recorded instant was no later
// (and a later call reads no later one: the state is the earliest
// grace_until of the life's rows); else no later than the clock over the
// life up to until, or than what the lives before may have recorded.
func (g *graceBound) bound(l int, until int64) int64 {
	first := int64(math.MaxInt64)
	for _, e := range g.fresh[l] {
		if e.Return >= until {
			break
		}
		first = min(first, e.Expires-e.TTL)
	}
	if first != math.MaxInt64 {
		return first
	}
	var from, past int64
	if l > 0 {
		from = g.cuts[l-1]
		p, ok := g.past[l-1]
		if !ok {
			p = g.bound(l-1, g.cuts[l-1])
			g.past[l-1] = p
		}
		past = p
	}
	return max(past, g.clockMax(from, until))
}

// mayBlock: a row lock of l's may have been what d found (l locksRow, d a
// denial). First, real time: l's locks are taken and let go between its
// Call and Return, d's lock attempt lies between its own. Then, where both
// brackets are valid (neither overlapped a clock step; overlapping in real
// time, no step lies between them either), raw server time: d tried the
// lock in [d.T0, d.T1]; l took its locks after l.T0; a renew or release
// that did not answer ok let its lock go inside the function (the
// subtransaction that took it is rolled back), before l.T1, while any
// other l may keep it until its commit (after l.T1, before its Return).
func (c *checker) mayBlock(l, d *Op) bool {
	if l == d || l.Call > ret(d) || ret(l) < d.Call {
		return false
	}
	if !definite(l) || l.T0 == 0 || d.T0 == 0 || c.loose(l) || c.loose(d) {
		return true // real time is all that is known
	}
	if l.T0 > d.T1 {
		return false
	}
	if (l.Kind == KRenew || l.Kind == KRelease) && l.Status != SOk {
		return l.T1 >= d.T0
	}
	return true
}

// grantEvidence: the owner o names for (key, epoch), if any.
func grantEvidence(o *Op) (epoch int64, owner string, ok bool) {
	if !definite(o) {
		return 0, "", false
	}
	switch {
	case (o.Kind == KAcquire || o.Kind == KAcquireWait) && o.Status == SGranted:
		return o.OutEpoch, o.Owner, true
	case (o.Kind == KRenew || o.Kind == KRelease) && o.Status == SOk:
		return o.Epoch, o.Owner, true
	case o.Kind == KInspect && o.Status == SHeld:
		return o.OutEpoch, o.OutOwner, true
	}
	return 0, "", false
}

// observation: the epoch counter o saw (at) and left (after).
func observation(o *Op) (at, after int64, isGrant bool, ok bool) {
	if !definite(o) {
		return 0, 0, false, false
	}
	switch o.Kind {
	case KAcquire, KAcquireWait:
		if o.Status == SGranted {
			return o.OutEpoch, o.OutEpoch, true, true
		}
	case KRenew:
		if o.Status == SOk {
			return o.Epoch, o.Epoch, true, true
		}
	case KRelease:
		if o.Status == SOk {
			return o.Epoch, o.Epoch + 1, false, true
		}
	case KInspect:
		switch o.Status {
		case SHeld:
			return o.OutEpoch, o.OutEpoch, true, true
		case SFree:
			return o.OutEpoch, o.OutEpoch, false, true
		case SAbsent:
			return 0, 0, false, true
		}
	}
	return 0, 0, false, false
}

func ruleFor(o *Op) string {
	switch o.Kind {
	case KRenew, KRelease:
		return "I9"
	case KInspect:
		return "I11"
	}
	return "I3"
}

// checkEpochs: one owner per (key, epoch); epochs never regress in real
// time; fresh grants strictly above everything observed before.
func (c *checker) checkEpochs(key string) {
	ops := c.byKey[key]
	owners := map[int64]*Op{}
	for _, o := range ops {
		e, owner, ok := grantEvidence(o)
		if !ok {
			continue
		}
		if first, ok := owners[e]; ok {
			fe, fo, _ := grantEvidence(first)
			if fo != owner && fe == e {
				c.violate(ruleFor(o), key, fmt.Sprintf("epoch %d belongs to %s (op %d) but op %d (%s %s) reports it for %s",
					e, fo, first.ID, o.ID, o.Kind, o.Status, owner), first, o)
			}
			continue
		}
		owners[e] = o
		c.res.Grants++
	}
	// Real-time sweep: ops sorted by return; for each b (by call) the
	// maximum counter left by ops that returned before b was invoked.
	byRet := make([]*Op, 0, len(ops))
	for _, o := range ops {
		if _, _, _, ok := observation(o); ok {
			byRet = append(byRet, o)
		}
	}
	sort.SliceStable(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	var (
		maxAfter int64 = -1
		maxOp    *Op
		i        int
	)
	for _, b := range ops {
		for i < len(byRet) && byRet[i].Return < b.Call {
			_, after, _, _ := observation(byRet[i])
			if after > maxAfter {
				maxAfter, maxOp = after, byRet[i]
			}
			i++
		}
		at, _, _, ok := observation(b)
		if !ok || maxOp == nil {
			continue
		}
		if c.failover && !c.fresh(b) {
			continue
		}
		if at < maxAfter {
			rule := "I2"
			if b.Kind == KRenew || b.Kind == KRelease {
				rule = "I9"
			} else if b.Kind == KInspect {
				rule = "I11"
			}
			c.violate(rule, key, fmt.Sprintf("op %d (%s by %s) observed epoch %d after op %d had left epoch %d",
				b.ID, b.Kind, b.Owner, at, maxOp.ID, maxAfter), maxOp, b)
			continue
		}
		if c.fresh(b) && at == maxAfter {
			c.violate("I3", key, fmt.Sprintf("op %d granted epoch %d afresh, but op %d had already observed epoch %d",
				b.ID, at, maxOp.ID, maxAfter), maxOp, b)
		}
	}
}

// holderOps: the ops of owner on key, in program order (by Call).
func (c *checker) holderOps(key, owner string) []*Op {
	var out []*Op
	for _, o := range c.byKey[key] {
		if o.Owner == owner && o.Kind != KInspect {
			out = append(out, o)
		}
	}
	return out
}

type grantInfo struct {
	epoch   int64
	owner   string
	lastSet *Op   // last definite acquire/renew setting its expiry
	release *Op   // first release of it (ok or unknown) after lastSet
	unkRen  []*Op // unknown renewals after lastSet
	start   *Op   // fresh acquire
}

func (c *checker) grants(key string) []*grantInfo {
	byEpoch := map[int64]*grantInfo{}
	var list []*grantInfo
	for _, o := range c.byKey[key] {
		e, owner, ok := grantEvidence(o)
		if !ok || o.Kind == KInspect {
			continue
		}
		if byEpoch[e] == nil {
			g := &grantInfo{epoch: e, owner: owner}
			byEpoch[e] = g
			list = append(list, g)
		}
	}
	for _, g := range list {
		for _, o := range c.holderOps(key, g.owner) {
			switch {
			case c.failover && o.Kind == KRenew && sets(o, g.epoch) && g.release != nil && g.release.Status == SOk:
				// A renewal of a token its owner released: only a lost
				// release lets it succeed (after a failover), and an owner
				// that acts on a token it gave up breaks the client's side
				// of the contract. Not a belief of the owner: counted.
				c.res.RenewAfterRelease++
			case sets(o, g.epoch):
				g.lastSet, g.release, g.unkRen = o, nil, nil
				if c.fresh(o) && g.start == nil {
					g.start = o
				}
			case g.lastSet == nil:
			case o.Kind == KRelease && o.Epoch == g.epoch && (o.Outcome == Unknown || o.Status == SOk):
				if g.release == nil {
					g.release = o
				}
			case o.Kind == KRenew && o.Epoch == g.epoch && o.Outcome == Unknown:
				g.unkRen = append(g.unkRen, o)
			}
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].epoch < list[j].epoch })
	return list
}

func (c *checker) checkI1(key string) {
	gs := c.grants(key)
	for _, g := range gs {
		if g.start != nil {
			c.res.FreshGrants++
		}
	}
	for i, g := range gs {
		if g.lastSet == nil {
			continue
		}
		E := g.lastSet.Expires
		for _, h := range gs[i+1:] {
			if h.start == nil || h.owner == "" {
				continue
			}
			// Raw server times are comparable across a backward step only
			// for a direct takeover (h.epoch = g.epoch + 1: the server
			// compared d_h with g's stored expiry); otherwise the grants
			// in between were compared, and the chain is monotone only
			// without a backward step.
			skip := h.epoch != g.epoch+1 && c.backStepBetween(g.lastSet.Call, h.start.Return)
			for _, u := range g.unkRen {
				if c.backStepBetween(g.lastSet.Call, ret(u)) {
					skip = true
				}
			}
			if skip {
				c.res.I1Skipped++
				continue
			}
			c.res.I1Pairs++
			dh := h.start.Expires - h.start.TTL
			if dh >= E {
				continue
			}
			if r := g.release; r != nil {
				if h.start.Return >= r.Call {
					// The release may have come first.
					if r.Outcome == Unknown || c.loose(r) || c.backStepBetween(r.Call, h.start.Return) || dh >= r.T0 {
						continue
					}
				}
			}
			c.violate("I1", key, fmt.Sprintf("grant %d of %s (expiry %s, op %d) overlaps grant %d of %s decided at %s (op %d)",
				g.epoch, g.owner, fmtMicros(E), g.lastSet.ID, h.epoch, h.owner, fmtMicros(dh), h.start.ID), g.lastSet, h.start)
		}
	}
}

// checkI9: renewals decide before the expiry; releases start before it.
func (c *checker) checkI9(key string) {
	owners := map[string]bool{}
	for _, o := range c.byKey[key] {
		owners[o.Owner] = true
	}
	for owner := range owners {
		var prev *Op // last definite op setting the current grant's expiry
		for _, o := range c.holderOps(key, owner) {
			if o.Outcome == Unknown {
				prev = nil
				continue
			}
			if !definite(o) {
				continue
			}
			if prev != nil && (o.Kind == KRenew || o.Kind == KRelease) && o.Status == SOk && o.Epoch == prev.OutEpochOrEpoch() {
				E := prev.Expires
				switch {
				case o.Kind == KRenew && o.Expires-o.TTL >= E:
					c.violate("I9", key, fmt.Sprintf("renew of epoch %d by %s reported ok at %s, after the grant lapsed at %s",
						o.Epoch, owner, fmtMicros(o.Expires-o.TTL), fmtMicros(E)), prev, o)
				case o.Kind == KRelease && !c.loose(o) && o.T0 >= E:
					c.violate("I9", key, fmt.Sprintf("release of epoch %d by %s reported ok at %s or later, after the grant lapsed at %s",
						o.Epoch, owner, fmtMicros(o.T0), fmtMicros(E)), prev, o)
				}
			}
			if o.Kind == KRenew && o.Status == SOk && !c.loose(o) {
				if d := o.Expires - o.TTL; d < o.T0 || d > o.T1 {
					c.violate("I9", key, fmt.Sprintf("renew by %s: expires_at - ttl = %s lies outside the statement's clock readings [%s, %s]",
						owner, fmtMicros(d), fmtMicros(o.T0), fmtMicros(o.T1)), o)
				}
			}
			switch {
			case sets(o, o.OutEpochOrEpoch()):
				prev = o
			case o.Kind == KRelease && o.Status == SOk:
				prev = nil
			}
		}
	}
}

// OutEpochOrEpoch is the epoch an op is about: the granted one for acquire,
// the input one otherwise.
func (o *Op) OutEpochOrEpoch() int64 {
	if o.Kind == KAcquire || o.Kind == KAcquireWait || o.Kind == KInspect {
		return o.OutEpoch
	}
	return o.Epoch
}

// lastSetBefore: the op of owner on key that last set the expiry of epoch
// before i, when nothing else of owner's could have changed it by then; nil
// when that cannot be known.
func (c *checker) lastSetBefore(key, owner string, epoch int64, i *Op) *Op {
	ops := c.holderOps(key, owner)
	for j := len(ops) - 1; j >= 0; j-- {
		o := ops[j]
		if o.Call > ret(i) {
			continue
		}
		if o.Outcome == Unknown {
			return nil
		}
		if !definite(o) {
			continue
		}
		if sets(o, epoch) {
			if o.Return >= i.Call {
				return nil // concurrent with the inspect
			}
			return o
		}
		if o.Kind == KRelease && o.Status == SOk {
			return nil
		}
		if (o.Kind == KAcquire || o.Kind == KAcquireWait) && o.Status == SGranted {
			return nil // another grant of owner's
		}
	}
	return nil
}

func (c *checker) checkI11(key string) {
	gs := map[int64]*grantInfo{}
	for _, g := range c.grants(key) {
		gs[g.epoch] = g
	}
	for _, i := range c.byKey[key] {
		if i.Kind != KInspect || !definite(i) || c.loose(i) {
			continue
		}
		switch i.Status {
		case SHeld:
			if i.Expires <= i.T0 {
				c.violate("I11", key, fmt.Sprintf("inspect says held until %s, but it read the clock at %s", fmtMicros(i.Expires), fmtMicros(i.T0)), i)
			}
			if p := c.lastSetBefore(key, i.OutOwner, i.OutEpoch, i); p != nil && p.Expires != i.Expires {
				c.violate("I11", key, fmt.Sprintf("inspect says epoch %d of %s expires at %s, but op %d set it to %s",
					i.OutEpoch, i.OutOwner, fmtMicros(i.Expires), p.ID, fmtMicros(p.Expires)), p, i)
			}
		case SFree:
			g := gs[i.OutEpoch]
			if g == nil {
				continue
			}
			if p := c.lastSetBefore(key, g.owner, g.epoch, i); p != nil && p.Expires > i.T1 {
				c.violate("I11", key, fmt.Sprintf("inspect says not held (epoch %d) at %s or earlier, but op %d holds epoch %d until %s",
					i.OutEpoch, fmtMicros(i.T1), p.ID, g.epoch, fmtMicros(p.Expires)), p, i)
			}
		}
	}
}

func (c *checker) checkGuard(key string) {
	ops := c.guards[key]
	var acc []*Op
	for _, o := range ops {
		if definite(o) && o.Status == SAccepted {
			acc = append(acc, o)
		}
	}
	sort.SliceStable(acc, func(i, j int) bool { return acc[i].GuardSeq < acc[j].GuardSeq })
	for j := 1; j < len(acc); j++ {
		a, b := acc[j-1], acc[j]
		if a.GuardSeq == b.GuardSeq {
			c.violate("FENCE", key, fmt.Sprintf("guard write counter %d used twice", a.GuardSeq), a, b)
		}
		if b.Epoch < a.Epoch {
			c.violate("FENCE", key, fmt.Sprintf("guard accepted epoch %d (write %d) after epoch %d (write %d)",
				b.Epoch, b.GuardSeq, a.Epoch, a.GuardSeq), a, b)
		}
	}
	// Real time: no acceptance of a lower epoch after a higher one was
	// accepted and acknowledged.
	byRet := append([]*Op(nil), acc...)
	sort.SliceStable(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	byCall := append([]*Op(nil), acc...)
	sort.SliceStable(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	var best *Op
	k := 0
	for _, b := range byCall {
		for k < len(byRet) && byRet[k].Return < b.Call {
			if best == nil || byRet[k].Epoch > best.Epoch {
				best = byRet[k]
			}
			k++
		}
		if best != nil && b.Epoch < best.Epoch {
			c.violate("FENCE", key, fmt.Sprintf("guard accepted epoch %d (op %d) after it had accepted epoch %d (op %d)",
				b.Epoch, b.ID, best.Epoch, best.ID), best, b)
		}
	}
	// A rejection needs a higher epoch written (or maybe written) before.
	for _, r := range ops {
		if !definite(r) || r.Status != SRejected {
			continue
		}
		ok := false
		for _, w := range ops {
			if w.Epoch > r.Epoch && w.Call < r.Return && (w.Outcome == Unknown || w.Status == SAccepted) {
				ok = true
				break
			}
		}
		if !ok {
			c.violate("FENCE", key, fmt.Sprintf("guard rejected epoch %d (op %d) though no higher epoch was written before", r.Epoch, r.ID), r)
		}
	}
}

// mops: the key's operations for porcupine.
func (c *checker) mops(key string) []porcupine.Operation {
	var out []porcupine.Operation
	for _, o := range c.byKey[key] {
		m := mop{Op: o, b0: o.T0, b1: o.T1, busy: c.busyOps[o.ID], grace: c.graceOps[o.ID], bases: c.bases}
		if c.loose(o) || o.Outcome != OK || o.Status == STimeout {
			// (a timeout is an error: the statement's clock readings
			// never reach the client)
			m.b0, m.b1 = negInf, posInf
		}
		r := ret(o)
		if o.Outcome == Fail {
			continue // no effect
		}
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: m, Call: o.Call, Output: nil, Return: r})
	}
	return out
}

func (c *checker) checkLin(key string, timeout time.Duration) {
	ops := c.mops(key)
	model := leaseModel()
	res := porcupine.CheckOperationsTimeout(model, ops, timeout)
	c.res.Linearizable[key] = res
	if res != porcupine.Illegal {
		return
	}
	// Shrink: the shortest prefix (by invocation) that is not linearizable.
	lo, hi := 1, len(ops)
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(model, ops[:mid], timeout/4) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	last := ops[hi-1].Input.(mop).Op
	from := max(0, hi-12)
	var ids []int
	for _, o := range ops[from:hi] {
		ids = append(ids, o.Input.(mop).ID)
	}
	c.res.Violations = append(c.res.Violations, Violation{Rule: "LIN", Key: key,
		Msg: fmt.Sprintf("not linearizable: the shortest failing prefix ends with op %d (%s); its last operations are listed", last.ID, describeOp(last)),
		Ops: ids})
}

func describeOp(o *Op) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%s", o.Kind, o.Key)
	switch o.Kind {
	case KAcquire, KAcquireWait:
		fmt.Fprintf(&b, ", %s, ttl=%v", o.Owner, time.Duration(o.TTL)*time.Microsecond)
		if o.Wait > 0 {
			fmt.Fprintf(&b, ", wait=%v", time.Duration(o.Wait)*time.Microsecond)
		}
	case KRenew:
		fmt.Fprintf(&b, ", %s, epoch=%d, ttl=%v", o.Owner, o.Epoch, time.Duration(o.TTL)*time.Microsecond)
	case KRelease, KGuard:
		fmt.Fprintf(&b, ", %s, epoch=%d", o.Owner, o.Epoch)
	}
	b.WriteString(") -> ")
	switch o.Outcome {
	case OK:
		b.WriteString(o.Status)
		switch {
		case o.Status == SGranted:
			fmt.Fprintf(&b, " epoch=%d expires=%s", o.OutEpoch, fmtMicros(o.Expires))
		case o.Kind == KRenew && o.Status == SOk:
			fmt.Fprintf(&b, " expires=%s", fmtMicros(o.Expires))
		case o.Status == SHeld:
			fmt.Fprintf(&b, " %s epoch=%d expires=%s", o.OutOwner, o.OutEpoch, fmtMicros(o.Expires))
		case o.Status == SFree:
			fmt.Fprintf(&b, " epoch=%d", o.OutEpoch)
		case o.Status == SAccepted:
			fmt.Fprintf(&b, " write=%d", o.GuardSeq)
		case o.Status == SDenied && o.GraceUntil != 0:
			fmt.Fprintf(&b, " grace_until=%s", fmtMicros(o.GraceUntil))
		}
		if o.T0 != 0 {
			fmt.Fprintf(&b, " server=[%s, %s]", fmtMicros(o.T0), fmtMicros(o.T1))
		}
	default:
		b.WriteString(o.Outcome)
		if o.Err != "" {
			fmt.Fprintf(&b, " (%s)", o.Err)
		}
	}
	return b.String()
}

// Report writes the seed, the counts, and for every violation (at most
// limit) the operations of its key around it: from a second before its first
// operation to a second after its last, at most 40.
func Report(w io.Writer, h *History, r *Result, limit int) {
	fmt.Fprintf(w, "seed %d, %d operations, %d faults, %d violations\n", h.Meta.Seed, len(h.Ops), len(h.Faults), len(r.Violations))
	for n, v := range r.Violations {
		if n >= limit {
			fmt.Fprintf(w, "... %d more violations\n", len(r.Violations)-limit)
			break
		}
		fmt.Fprintf(w, "\nVIOLATION %s\n", v)
		if len(v.Ops) == 0 {
			continue
		}
		lo, hi := int64(Never), int64(0)
		for _, id := range v.Ops {
			o := &h.Ops[id]
			lo = min(lo, o.Call)
			hi = max(hi, min(ret(o), o.Call+int64(30*time.Second)))
		}
		lo -= int64(time.Second)
		hi += int64(time.Second)
		var around []*Op
		for i := range h.Ops {
			o := &h.Ops[i]
			if o.Key == v.Key && o.Call <= hi && ret(o) >= lo {
				around = append(around, o)
			}
		}
		if len(around) > 40 {
			// Keep the 40 closest to the violation's operations.
			dist := func(o *Op) int {
				d := len(h.Ops)
				for _, id := range v.Ops {
					d = min(d, abs(o.ID-id))
				}
				return d
			}
			sort.SliceStable(around, func(i, j int) bool { return dist(around[i]) < dist(around[j]) })
			around = around[:40]
			sort.SliceStable(around, func(i, j int) bool { return around[i].ID < around[j].ID })
		}
		for _, o := range around {
			mark := " "
			for _, id := range v.Ops {
				if id == o.ID {
					mark = "*"
				}
			}
			rt := "never"
			if ret(o) != Never {
				rt = fmt.Sprintf("%.3f", float64(ret(o)-h.Meta.Start)/1e9)
			}
			busy := ""
			if r.busy[o.ID] {
				busy = " (busy-possible: may have found the row locked)"
			}
			if r.grace[o.ID] {
				busy += " (grace-possible: behind a grace a server life may have recorded)"
			}
			fmt.Fprintf(w, "%s op %d client %d [%.3f, %s] %s%s\n", mark, o.ID, o.Client, float64(o.Call-h.Meta.Start)/1e9, rt, describeOp(o), busy)
		}
		for _, f := range h.Faults {
			if f.Start <= hi && f.End >= lo {
				fmt.Fprintf(w, "  fault %s %s [%.3f, %.3f] %s\n", f.Kind, f.Mode, float64(f.Start-h.Meta.Start)/1e9, float64(f.End-h.Meta.Start)/1e9, f.Detail)
			}
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// Summary renders the counts.
func Summary(w io.Writer, h *History, r *Result) {
	fmt.Fprintf(w, "seed: %d\nduration: %v\nclients: %d (%d in worker processes)\nkeys: %v\n",
		h.Meta.Seed, time.Duration(h.Meta.End-h.Meta.Start).Round(time.Millisecond), h.Meta.Clients, h.Meta.Procs, h.Meta.Keys)
	fmt.Fprintf(w, "operations: %d\n", len(h.Ops))
	kinds := make([]string, 0, len(r.OpsByKind))
	for k := range r.OpsByKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		m := r.OpsByKind[k]
		outs := make([]string, 0, len(m))
		total := 0
		for o, n := range m {
			outs = append(outs, fmt.Sprintf("%s=%d", o, n))
			total += n
		}
		sort.Strings(outs)
		fmt.Fprintf(w, "  %-13s %6d  %s\n", k, total, strings.Join(outs, " "))
	}
	fk := make([]string, 0, len(r.FaultsByKind))
	for k, n := range r.FaultsByKind {
		fk = append(fk, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(fk)
	fmt.Fprintf(w, "faults: %d  %s\n", len(h.Faults), strings.Join(fk, " "))
	fmt.Fprintf(w, "unknown outcomes: %d (unbounded: %d); operations overlapping a clock step: %d\n", r.UnknownOps, r.UnboundedOps, r.LooseBrackets)
	fmt.Fprintf(w, "grants observed: %d (deciding acquire seen: %d); I1 pairs compared: %d, skipped: %d\n", r.Grants, r.FreshGrants, r.I1Pairs, r.I1Skipped)
	fmt.Fprintf(w, "denials (wait 0) and timeouts: %d, busy-possible (may have found the row locked): %d, grace-possible (after a restart behind a backward clock step): %d\n", r.Denials, r.BusyDenials, r.GraceDenials)
	if r.FailoverMode {
		fmt.Fprintf(w, "failover run: checked I1, one owner per epoch, fresh grants above every earlier observation; not I9, I11, FENCE, LIN; renewals ok after the owner's own release (lost): %d\n", r.RenewAfterRelease)
	}
	lk := make([]string, 0, len(r.Linearizable))
	for k, v := range r.Linearizable {
		lk = append(lk, fmt.Sprintf("%s=%s", k, v))
	}
	sort.Strings(lk)
	fmt.Fprintf(w, "linearizable (porcupine, per key): %s\n", strings.Join(lk, " "))
	fmt.Fprintf(w, "violations: %d\n", len(r.Violations))
}
