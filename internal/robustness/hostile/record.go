package hostile

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The checks, by name. Each violation names one.
const (
	CheckFreeKey   = "free-key"   // (1) a key read free is granted to an honest wait-0 acquire
	CheckHandover  = "handover"   // (2) a release hands the key only to a candidate of the releasing role
	CheckRate      = "retry-rate" // (3) no honest client calls faster than 10x its cadence
	CheckBounds    = "bounds"     // (4) registrations and history stay within the documented caps
	CheckEpochs    = "epochs"     // (5) the epochs honest parties observe only grow
	CheckOverlap   = "overlap"    // (6) no two honest believed terms of a key overlap
	CheckIsLeader  = "is-leader"  // (7) client-go's IsLeader is false while another role holds the key
	CheckWaits     = "waits"      // (8) no honest call waits on a lock another role's call left behind
	CheckInstaller = "installer"  // (9) an installer never runs another role's code, nor reports its objects as pg_lease
)

// AllChecks lists every check in report order.
var AllChecks = []string{CheckFreeKey, CheckHandover, CheckRate, CheckBounds, CheckEpochs,
	CheckOverlap, CheckIsLeader, CheckWaits, CheckInstaller}

// Violation is one honest outcome that a hostile role changed.
type Violation struct {
	Check string
	At    time.Duration // since the run's start, on this process's monotonic clock
	What  string
}

func (v Violation) String() string {
	return fmt.Sprintf("[%s] %7.3fs %s", v.Check, v.At.Seconds(), v.What)
}

// Term is what an honest party believed it held: key under epoch from Start
// until End (the earlier of the moment it saw the term end and the term's
// local deadline), on this process's monotonic clock.
type Term struct {
	Key, Party, Role string
	Epoch            int64
	Start, End       time.Duration
}

// Obs is an epoch of key that an honest party observed. The server state it
// reflects existed at some instant before Recv; after Sent when Sent >= 0
// (a read whose request was sent then). Seq orders one party's observations
// of one source.
type Obs struct {
	Key, Party, Source string
	Epoch              int64
	Sent, Recv         time.Duration
	Seq                int
}

// Calls are the SQL statements one honest party sent (its pools' and its
// listener's), with the most it may send in any window.
type Calls struct {
	Party string
	// Limit is the most statements per second allowed: ten times what the
	// party's configured cadence makes it send.
	Limit float64
	At    []time.Duration
}

// Recorder collects what the honest parties observed and the violations
// found during the run. Methods are safe for concurrent use.
type Recorder struct {
	base time.Time

	mu    sync.Mutex
	terms []Term
	obs   []Obs
	seq   map[string]int
	calls map[string]*Calls
	viol  []Violation
	stats map[string]int
}

// NewRecorder starts the run's clock.
func NewRecorder() *Recorder {
	return &Recorder{base: time.Now(), seq: map[string]int{}, calls: map[string]*Calls{}, stats: map[string]int{}}
}

// Now is the time since the run's start.
func (r *Recorder) Now() time.Duration { return time.Since(r.base) }

// At is t (with a monotonic reading of this process) since the run's start.
func (r *Recorder) At(t time.Time) time.Duration { return t.Sub(r.base) }

// Violate records a violation found now.
func (r *Recorder) Violate(check, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.viol = append(r.viol, Violation{Check: check, At: r.Now(), What: fmt.Sprintf(format, args...)})
}

// Count adds n to a statistic of the run.
func (r *Recorder) Count(stat string, n int) {
	r.mu.Lock()
	r.stats[stat] += n
	r.mu.Unlock()
}

// Max raises a statistic of the run to v.
func (r *Recorder) Max(stat string, v int64) {
	r.mu.Lock()
	if int(v) > r.stats[stat] {
		r.stats[stat] = int(v)
	}
	r.mu.Unlock()
}

// Term records a believed term.
func (r *Recorder) Term(t Term) {
	r.mu.Lock()
	r.terms = append(r.terms, t)
	r.mu.Unlock()
}

// Observe records an epoch of key that party saw through source.
func (r *Recorder) Observe(key, party, source string, epoch int64, sent, recv time.Duration) {
	if epoch == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := party + "\x00" + source + "\x00" + key
	r.seq[id]++
	r.obs = append(r.obs, Obs{Key: key, Party: party, Source: source, Epoch: epoch, Sent: sent, Recv: recv, Seq: r.seq[id]})
}

// Tracer returns a pgx tracer that counts every statement of party, whose
// cadence allows limit statements per second.
func (r *Recorder) Tracer(party string, limit float64) pgx.QueryTracer {
	r.mu.Lock()
	c := r.calls[party]
	if c == nil {
		c = &Calls{Party: party, Limit: limit}
		r.calls[party] = c
	}
	r.mu.Unlock()
	return &tracer{r: r, c: c}
}

type tracer struct {
	r *Recorder
	c *Calls
}

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	now := t.r.Now()
	t.r.mu.Lock()
	t.c.At = append(t.c.At, now)
	t.r.mu.Unlock()
	return ctx
}

func (t *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Data is everything recorded, for the checks that run after the workload.
type Data struct {
	Terms      []Term
	Obs        []Obs
	Calls      []Calls
	Violations []Violation
	Stats      map[string]int
}

// Data returns a copy of what was recorded so far.
func (r *Recorder) Data() Data {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := Data{Terms: append([]Term(nil), r.terms...), Obs: append([]Obs(nil), r.obs...),
		Violations: append([]Violation(nil), r.viol...), Stats: map[string]int{}}
	for _, c := range r.calls {
		d.Calls = append(d.Calls, Calls{Party: c.Party, Limit: c.Limit, At: append([]time.Duration(nil), c.At...)})
	}
	sort.Slice(d.Calls, func(i, j int) bool { return d.Calls[i].Party < d.Calls[j].Party })
	for k, v := range r.stats {
		d.Stats[k] = v
	}
	return d
}
