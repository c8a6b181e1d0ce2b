package elector_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func testCtx(t *testing.T) context.Context { return pgtest.Context(t, 0) }

// installed creates pg_lease in a fresh database on s (nil: the shared
// server) and returns its DSN.
func installed(t *testing.T, s *pgtest.Server) string {
	t.Helper()
	ctx := testCtx(t)
	var dsn string
	if s == nil {
		if err := pgtest.Shared(t).InstallExtensionFiles(ctx); err != nil {
			t.Fatal(err)
		}
		dsn = pgtest.NewDatabase(t)
	} else {
		if err := s.InstallExtensionFiles(ctx); err != nil {
			t.Fatal(err)
		}
		var err error
		if dsn, err = s.NewDatabase(ctx); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

func newPool(t *testing.T, dsn string) *pgxpool.Pool { return pgtest.NewPool(t, dsn) }

func execSQL(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(testCtx(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// clockOffset measures the server clock minus the local clock, with its
// uncertainty (half the best round trip of a few).
func clockOffset(t *testing.T, pool *pgxpool.Pool) (offset, uncert time.Duration) {
	t.Helper()
	uncert = time.Hour
	for range 5 {
		var server time.Time
		t0 := time.Now()
		if err := pool.QueryRow(testCtx(t), "SELECT clock_timestamp()").Scan(&server); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if u := t1.Sub(t0) / 2; u < uncert {
			uncert = u
			offset = server.Sub(t0.Add(u))
		}
	}
	return offset, uncert
}

// termRec is what a test records about one term.
type termRec struct {
	id        string
	token     lease.Token
	grant     lease.Grant // at start
	last      lease.Grant // latest grant, at OnStoppedLeading
	start     time.Time   // OnStartedLeading entered
	cancelled time.Time   // leader context observed done
	returned  time.Time   // OnStartedLeading returned
	cause     error
}

// recorder collects terms from several electors of one process.
type recorder struct {
	mu     sync.Mutex
	terms  []*termRec
	active int
	maxAct int
	events chan *termRec // started terms
	ended  chan *termRec // terms whose OnStartedLeading returned
}

func newRecorder() *recorder {
	return &recorder{events: make(chan *termRec, 1000), ended: make(chan *termRec, 1000)}
}

// callbacks returns callbacks for an elector that record into r; work runs
// as the body of each term (nil: wait for cancellation).
func (r *recorder) callbacks(id string, el **elector.Elector, work func(ctx context.Context, tr *termRec)) elector.Callbacks {
	var cur *termRec
	return elector.Callbacks{
		OnStartedLeading: func(ctx context.Context) {
			tr := &termRec{id: id, start: time.Now()}
			tr.token, _ = lease.TokenFromContext(ctx)
			tr.grant = (*el).Status().Grant
			r.mu.Lock()
			r.active++
			r.maxAct = max(r.maxAct, r.active)
			r.terms = append(r.terms, tr)
			cur = tr
			r.mu.Unlock()
			stop := context.AfterFunc(ctx, func() {
				r.mu.Lock()
				tr.cancelled = time.Now()
				tr.cause = context.Cause(ctx)
				r.mu.Unlock()
			})
			r.events <- tr
			if work != nil {
				work(ctx, tr)
			} else {
				<-ctx.Done()
			}
			stop()
			r.mu.Lock()
			if tr.cancelled.IsZero() && ctx.Err() != nil {
				tr.cancelled = time.Now()
				tr.cause = context.Cause(ctx)
			}
			r.active--
			tr.returned = time.Now()
			r.mu.Unlock()
		},
		OnStoppedLeading: func() {
			r.mu.Lock()
			cur.last = (*el).Status().Grant
			tr := cur
			r.mu.Unlock()
			r.ended <- tr
		},
	}
}

func (r *recorder) snapshot() []termRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]termRec, len(r.terms))
	for i, t := range r.terms {
		out[i] = *t
	}
	return out
}

func waitTerm(t *testing.T, ch chan *termRec, within time.Duration) *termRec {
	t.Helper()
	select {
	case tr := <-ch:
		return tr
	case <-time.After(within):
		t.Fatalf("no term event within %v", within)
		return nil
	}
}

// runElector runs el until the returned stop function is called; stop
// waits for Run to return and checks its error.
func runElector(t *testing.T, el *elector.Elector) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(time.Minute):
				t.Errorf("Run did not return within a minute of cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// value reads a gauge's or counter's value (prometheus/testutil would add
// a dependency to go.mod).
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Counter != nil:
		return d.Counter.GetValue()
	}
	t.Fatalf("%v is neither a gauge nor a counter", m.Desc())
	return 0
}

// seriesCount counts the series of the metric family name in g, and checks
// that a histogram's series observed something.
func seriesCount(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				if h := m.Histogram; h != nil && h.GetSampleCount() == 0 {
					t.Errorf("%s: histogram series without samples", name)
				}
			}
			return len(mf.Metric)
		}
	}
	return 0
}

// renewsAfter counts the renewals of epoch sent after since.
func renewsAfter(sent *pgtest.Statements, epoch int64, since time.Time) int {
	n := 0
	for _, st := range sent.Calling("lease.renew") {
		if len(st.Args) >= 3 && st.Args[2] == epoch && st.At.After(since) {
			n++
		}
	}
	return n
}
