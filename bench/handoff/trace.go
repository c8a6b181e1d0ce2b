package main

// The handoff's trace (where each millisecond goes) and the baseline (the
// physical limit, measured the same way).

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/bench/internal/benchutil"
)

// span is one query of a candidate: the pg_lease function it called (or
// "sql"), when it was sent and when its answer came.
type span struct {
	what       string
	start, end time.Time
}

// tracer is a pgx.QueryTracer that keeps the spans of one candidate's
// queries since the last reset. A nil tracer records nothing.
type tracer struct {
	mu  sync.Mutex
	all []span
}

type spanStart struct{}

// started is what TraceQueryStart keeps in the query's context.
type started struct {
	at  time.Time
	sql string
}

var leaseFunc = regexp.MustCompile(`lease\.(\w+)\(`)

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, spanStart{}, started{at: time.Now(), sql: data.SQL})
}

func (t *tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	end := time.Now()
	st, ok := ctx.Value(spanStart{}).(started)
	if !ok {
		return
	}
	what := "sql"
	if m := leaseFunc.FindStringSubmatch(st.sql); m != nil {
		what = m[1]
	}
	t.mu.Lock()
	t.all = append(t.all, span{what: what, start: st.at, end: end})
	t.mu.Unlock()
}

func (t *tracer) reset() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.all = nil
	t.mu.Unlock()
}

func (t *tracer) spans() []span {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := append([]span(nil), t.all...)
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// stageNames are a traced handoff's milestones, in order, as ms from the
// cancel of the leader's context.
var stageNames = []string{
	"release sent",         // the old leader's release query left
	"release answered",     // its answer (the commit, with the notification, is durable)
	"notified",             // the successor's Waiter read the notification
	"successor first call", // the successor's first query after it
	"successor last answer",
	"OnStartedLeading", // the successor's callback began
}

// stages computes one trial's milestones from the candidates' spans: a's
// (the old leader) and b's (the successor), the notification's receipt tn
// (zero: not seen) and OnStartedLeading at t1. It also names the calls each
// side made: a's from t0 to its release's answer, b's from tn to t1.
func stages(t0, t1, tn time.Time, a, b []span) (map[string]float64, []string, []string) {
	ms := func(t time.Time) float64 { return float64(t.Sub(t0)) / float64(time.Millisecond) }
	st := map[string]float64{"OnStartedLeading": ms(t1)}
	var leader, successor []string
	for _, s := range a {
		if s.start.Before(t0) {
			continue
		}
		leader = append(leader, s.what)
		if s.what == "release" {
			st["release sent"], st["release answered"] = ms(s.start), ms(s.end)
			break
		}
	}
	if !tn.IsZero() {
		st["notified"] = ms(tn)
		for _, s := range b {
			if s.start.Before(tn) || s.start.After(t1) {
				continue
			}
			if len(successor) == 0 {
				st["successor first call"] = ms(s.start)
			}
			successor = append(successor, s.what)
			st["successor last answer"] = ms(s.end)
		}
	}
	return st, leader, successor
}

// writeStages writes the median of each milestone per system, and the calls
// each side made most often, for profile p's traced handoffs.
func writeStages(md *strings.Builder, p string, systems []*system, results []trialResult) {
	header := false
	for _, sys := range systems {
		vals := map[string][]float64{}
		leader, successor, how := map[string]int{}, map[string]int{}, map[string]int{}
		n := 0
		for _, r := range results {
			if r.Profile != p || r.System != sys.name || r.Scenario != "handoff" || r.Stages == nil {
				continue
			}
			n++
			for k, v := range r.Stages {
				vals[k] = append(vals[k], v)
			}
			leader[strings.Join(r.LeaderCalls, " → ")]++
			successor[strings.Join(r.SuccessorCalls, " → ")]++
			how[r.How]++
		}
		if n == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(md, "\nWhere the time goes (traced handoffs; median ms from the cancel of the leader's context):\n\n| elector | trials |")
			for _, s := range stageNames {
				fmt.Fprintf(md, " %s |", s)
			}
			fmt.Fprintf(md, " old leader's calls | successor's calls after the notification | successor's term began by |\n|---|---|")
			for range stageNames {
				fmt.Fprintf(md, "---|")
			}
			fmt.Fprintf(md, "---|---|---|\n")
			header = true
		}
		fmt.Fprintf(md, "| %s | %d |", sys.name, n)
		for _, s := range stageNames {
			if v := vals[s]; len(v) > 0 {
				fmt.Fprintf(md, " %.2f |", benchutil.Summarize(v).P50)
			} else {
				fmt.Fprintf(md, " – |")
			}
		}
		fmt.Fprintf(md, " %s | %s | %s |\n", mostly(leader, n), mostly(successor, n), mostly(how, n))
	}
}

// mostly names the most frequent value of counts and its share of n.
func mostly(counts map[string]int, n int) string {
	best, bn := "", -1
	for k, c := range counts {
		if c > bn || (c == bn && k < best) {
			best, bn = k, c
		}
	}
	if best == "" {
		best = "(none)"
	}
	return fmt.Sprintf("%s (%d of %d)", best, bn, n)
}

// baseline is the physical limit of a handoff on this server: a durable
// UPDATE that notifies (the release), the notification's trip to a
// listening connection and the wake-up of its reader, and a second durable
// UPDATE (the grant) on a third connection, all from this process.
type baseline struct {
	leader, listener, successor *pgx.Conn
}

func newBaseline(ctx context.Context, dsn string) (*baseline, error) {
	b := &baseline{}
	var err error
	for _, c := range []**pgx.Conn{&b.leader, &b.listener, &b.successor} {
		if *c, err = pgx.Connect(ctx, dsn); err != nil {
			b.close()
			return nil, err
		}
	}
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS bench_baseline (k int PRIMARY KEY, v bigint NOT NULL)`,
		`INSERT INTO bench_baseline VALUES (1, 0), (2, 0) ON CONFLICT DO NOTHING`,
	} {
		if _, err := b.leader.Exec(ctx, q); err != nil {
			b.close()
			return nil, err
		}
	}
	if _, err := b.listener.Exec(ctx, `LISTEN bench_baseline`); err != nil {
		b.close()
		return nil, err
	}
	// Prepare both statements, as a warm pool has them.
	for i := 0; i < 3; i++ {
		if _, err := b.once(ctx); err != nil {
			b.close()
			return nil, err
		}
	}
	return b, nil
}

// once times one release-notify-grant.
func (b *baseline) once(ctx context.Context) (time.Duration, error) {
	got := make(chan error, 1)
	var t1 time.Time
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		if _, err := b.listener.WaitForNotification(wctx); err != nil {
			got <- err
			return
		}
		_, err := b.successor.Exec(wctx, `UPDATE bench_baseline SET v = v + 1 WHERE k = 2`)
		t1 = time.Now()
		got <- err
	}()
	time.Sleep(2 * time.Millisecond) // the listener waits
	t0 := time.Now()
	if _, err := b.leader.Exec(ctx,
		`WITH u AS (UPDATE bench_baseline SET v = v + 1 WHERE k = 1 RETURNING v) SELECT pg_notify('bench_baseline', v::text) FROM u`); err != nil {
		cancel()
		<-got
		return 0, err
	}
	if err := <-got; err != nil {
		return 0, err
	}
	return t1.Sub(t0), nil
}

func (b *baseline) close() {
	for _, c := range []*pgx.Conn{b.leader, b.listener, b.successor} {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}
}
