package lease

// Unit tests of the term and the margin rule on a fake clock, with a fake
// server behind the Querier: no PostgreSQL needed.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeServer answers renew and release on the fake clock (server clock =
// local clock). status is what renew and release answer; a renewal takes
// delay of fake time (the clock is stepped while the "query" runs).
type fakeServer struct {
	clk *clocktesting.FakeClock

	mu       sync.Mutex
	status   string
	delay    time.Duration
	jump     time.Duration   // the server's clock jumps by this after computing a renewal's expiry
	down     bool            // renewals fail as on an unreachable server
	lapsed   map[string]bool // keys whose renewal answers lapsed (renew_many)
	renews   int
	batches  [][]string // the keys of each renew_many
	releases int
}

type fakeRow struct{ scan func(dest ...any) error }

func (r fakeRow) Scan(dest ...any) error { return r.scan(dest...) }

func (s *fakeServer) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("fake: Exec")
}

func (s *fakeServer) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !strings.Contains(sql, "lease.renew_many") {
		return nil, errors.New("fake: Query")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, errors.New("fake: server down")
	}
	keys, ttl := args[0].([]string), args[3].(time.Duration)
	s.batches = append(s.batches, keys)
	now := s.clk.Now()
	exp := now.Add(ttl)
	rows := &fakeRows{}
	for _, k := range keys {
		status, e := "ok", &exp
		if s.lapsed[k] {
			status, e = "lapsed", nil
		}
		rows.rows = append(rows.rows, []any{status, e, now})
	}
	return rows, nil
}

// fakeRows are the rows of a renew_many: status, expires_at, server time.
type fakeRows struct {
	rows [][]any
	cur  []any
}

func (r *fakeRows) Close()                                       {}
func (r *fakeRows) Err() error                                   { return nil }
func (r *fakeRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *fakeRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *fakeRows) Values() ([]any, error)                       { return r.cur, nil }
func (r *fakeRows) RawValues() [][]byte                          { return nil }
func (r *fakeRows) Conn() *pgx.Conn                              { return nil }
func (r *fakeRows) TypeMap() *pgtype.Map                         { return nil }

func (r *fakeRows) Next() bool {
	if len(r.rows) == 0 {
		return false
	}
	r.cur, r.rows = r.rows[0], r.rows[1:]
	return true
}

func (r *fakeRows) Scan(dest ...any) error {
	*dest[0].(*string) = r.cur[0].(string)
	*dest[1].(**time.Time) = r.cur[1].(*time.Time)
	*dest[2].(*time.Time) = r.cur[2].(time.Time)
	return nil
}

func (s *fakeServer) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	status := s.status
	if status == "" {
		status = "ok"
	}
	switch {
	case strings.Contains(sql, "lease.renew"):
		s.renews++
		if s.down {
			return fakeRow{func(...any) error { return errors.New("fake: server down") }}
		}
		if s.delay > 0 {
			s.clk.Step(s.delay)
		}
		now := s.clk.Now()
		ttl := args[3].(time.Duration)
		return fakeRow{func(dest ...any) error {
			*dest[0].(*string) = status
			exp := now.Add(ttl)
			*dest[1].(**time.Time) = &exp
			*dest[2].(*time.Time) = now.Add(s.jump)
			return nil
		}}
	case strings.Contains(sql, "lease.release"):
		s.releases++
		return fakeRow{func(dest ...any) error { *dest[0].(*string) = status; return nil }}
	}
	return fakeRow{func(...any) error { return fmt.Errorf("fake: %s", sql) }}
}

func fakeClient(t *testing.T) (*Client, *fakeServer) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := &fakeServer{clk: clk}
	return New(s).WithClock(clk), s
}

// grantAt is a grant received at the fake clock's now, valid for ttl.
func grantAt(c *Client, ttl time.Duration) Grant {
	now := c.clock.Now()
	return newGrant(Token{Key: "k", Owner: "o", Epoch: 7}, now.Add(ttl), ttl, now, now)
}

func TestCheckMargin(t *testing.T) {
	for _, tc := range []struct {
		ttl, margin, want time.Duration
	}{
		{15 * time.Second, 0, 115 * time.Millisecond},       // 100ms + 15s/1000
		{300 * time.Millisecond, 0, 100 * time.Millisecond}, // capped at ttl/3
		{3 * time.Millisecond, 0, time.Millisecond},
		{time.Hour, 0, 100*time.Millisecond + 3600*time.Millisecond},
		{time.Second, time.Millisecond, time.Millisecond}, // the drift floor itself
		{time.Second, time.Second / 3, time.Second / 3},
	} {
		got, err := CheckMargin(tc.ttl, tc.margin)
		if err != nil || got != tc.want {
			t.Errorf("CheckMargin(%v, %v) = %v, %v; want %v", tc.ttl, tc.margin, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ ttl, margin time.Duration }{
		{2 * time.Millisecond, 0},                       // too short for a term
		{time.Second, time.Millisecond - 1},             // below the drift floor
		{time.Second, -time.Millisecond},                // negative
		{time.Second, time.Second/3 + time.Microsecond}, // above ttl/3
	} {
		if m, err := CheckMargin(tc.ttl, tc.margin); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("CheckMargin(%v, %v) = %v, %v; want ErrInvalidInput", tc.ttl, tc.margin, m, err)
		}
	}
}

type endReport struct {
	tok   Token
	cause error
}

func TestTermEndsAtLocalDeadline(t *testing.T) {
	c, _ := fakeClient(t)
	clk := c.clock.(*clocktesting.FakeClock)
	var ends []endReport
	g := grantAt(c, 10*time.Second)
	term, err := c.Begin(g, time.Second, func(tok Token, cause error) { ends = append(ends, endReport{tok, cause}) })
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(9 * time.Second); !term.Deadline().Equal(want) {
		t.Fatalf("deadline %v, want ValidUntil - margin = %v", term.Deadline(), want)
	}
	ctx, cancel := term.Context(context.Background())
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(term.Deadline()) {
		t.Fatalf("context deadline %v %v, want the term's %v", d, ok, term.Deadline())
	}
	if tok, ok := TokenFromContext(ctx); !ok || tok != g.Token {
		t.Fatalf("token %v %v", tok, ok)
	}
	clk.Step(9*time.Second - time.Nanosecond)
	if term.Err() != nil || ctx.Err() != nil || len(ends) != 0 {
		t.Fatalf("ended before its deadline: %v %v %v", term.Err(), ctx.Err(), ends)
	}
	clk.Step(time.Nanosecond)
	select {
	case <-term.Done():
	default:
		t.Fatal("Done not closed at the deadline")
	}
	if !errors.Is(term.Err(), ErrLocalDeadline) || !errors.Is(context.Cause(ctx), ErrLocalDeadline) {
		t.Fatalf("causes %v, %v", term.Err(), context.Cause(ctx))
	}
	if len(ends) != 1 || ends[0].tok != g.Token || !errors.Is(ends[0].cause, ErrLocalDeadline) {
		t.Fatalf("end reports %v", ends)
	}
	term.End(ErrReleased) // a second end changes nothing
	if len(ends) != 1 || !errors.Is(term.Err(), ErrLocalDeadline) {
		t.Fatalf("after a second end: %v %v", ends, term.Err())
	}
}

func TestTermRenewExtendsOnlyALiveTerm(t *testing.T) {
	c, srv := fakeClient(t)
	clk := c.clock.(*clocktesting.FakeClock)
	term, err := c.Begin(grantAt(c, 3*time.Second), 0, nil) // margin 100ms + 3ms
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	if err := term.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(3*time.Second - 103*time.Millisecond); !term.Deadline().Equal(want) {
		t.Fatalf("deadline after renewal %v, want %v", term.Deadline(), want)
	}
	// The old deadline's timer must not end the renewed term.
	clk.Step(time.Second)
	if term.Err() != nil {
		t.Fatalf("ended by a stale timer: %v", term.Err())
	}
	// A renewal whose answer comes after the deadline does not extend.
	srv.delay = 2 * time.Second
	err = term.Renew(context.Background())
	if !errors.Is(err, ErrLocalDeadline) || !errors.Is(term.Err(), ErrLocalDeadline) {
		t.Fatalf("late renewal: %v, term %v", err, term.Err())
	}
	// An ended term is not renewed at all.
	srv.delay = 0
	before := srv.renews
	if err := term.Renew(context.Background()); !errors.Is(err, ErrLocalDeadline) || srv.renews != before {
		t.Fatalf("renew of an ended term: %v (%d calls)", err, srv.renews-before)
	}
	// Its grant may still be held: Release gives it back.
	if err := term.Release(context.Background()); err != nil || srv.releases != 1 {
		t.Fatalf("release: %v (%d calls)", err, srv.releases)
	}
}

func TestTermLost(t *testing.T) {
	c, srv := fakeClient(t)
	var ends []endReport
	term, err := c.Begin(grantAt(c, time.Minute), 0, func(tok Token, cause error) { ends = append(ends, endReport{tok, cause}) })
	if err != nil {
		t.Fatal(err)
	}
	srv.status = "lapsed"
	err = term.Renew(context.Background())
	if !errors.Is(err, ErrLapsed) || !errors.Is(term.Err(), ErrLost) || len(ends) != 1 {
		t.Fatalf("renew answered lapsed: %v, term %v, ends %v", err, term.Err(), ends)
	}
	// A lost grant is not released.
	if err := term.Release(context.Background()); !errors.Is(err, ErrLapsed) || srv.releases != 0 {
		t.Fatalf("release of a lost term: %v (%d calls)", err, srv.releases)
	}
	// End with a lost cause also skips the release.
	t2, _ := c.Begin(grantAt(c, time.Minute), 0, nil)
	t2.End(fmt.Errorf("seen by a read: %w", ErrLost))
	if err := t2.Release(context.Background()); !errors.Is(err, ErrLost) || srv.releases != 0 {
		t.Fatalf("release after End(lost): %v (%d calls)", err, srv.releases)
	}
}

// lateTimers is a fake clock whose AfterFunc timers never fire: a deadline
// timer that has not run yet, as on a loaded machine.
type lateTimers struct {
	*clocktesting.FakeClock
	never *clocktesting.FakeClock
}

func (c lateTimers) AfterFunc(d time.Duration, f func()) clock.Timer { return c.never.AfterFunc(d, f) }

// TestTermEndsWithTheDeadlineWhoeverSeesIt: once the deadline has passed,
// the term's cause is ErrLocalDeadline whether the deadline timer, a
// renewal's answer or a release ends it: the cause does not depend on a
// timer that runs late.
func TestTermEndsWithTheDeadlineWhoeverSeesIt(t *testing.T) {
	setup := func(t *testing.T) (*Term, *fakeServer, *clocktesting.FakeClock, *[]endReport) {
		_, srv := fakeClient(t)
		late := lateTimers{FakeClock: srv.clk, never: clocktesting.NewFakeClock(srv.clk.Now())}
		c := New(srv).WithClock(late)
		ends := &[]endReport{}
		term, err := c.Begin(grantAt(c, 3*time.Second), time.Second, func(tok Token, cause error) {
			*ends = append(*ends, endReport{tok, cause})
		})
		if err != nil {
			t.Fatal(err)
		}
		return term, srv, srv.clk, ends
	}
	check := func(t *testing.T, term *Term, ends *[]endReport, want error) {
		t.Helper()
		if !errors.Is(term.Err(), want) || len(*ends) != 1 || !errors.Is((*ends)[0].cause, want) {
			t.Fatalf("term ended with %v (reports %v), want %v", term.Err(), *ends, want)
		}
	}

	t.Run("release after the deadline", func(t *testing.T) {
		term, srv, clk, ends := setup(t)
		clk.Step(2 * time.Second) // the deadline; its timer has not run
		if term.Err() != nil {
			t.Fatal("the deadline timer ran")
		}
		if err := term.Release(context.Background()); err != nil || srv.releases != 1 {
			t.Fatalf("release: %v (%d calls)", err, srv.releases)
		}
		check(t, term, ends, ErrLocalDeadline)
	})
	t.Run("release before the deadline", func(t *testing.T) {
		term, _, clk, ends := setup(t)
		clk.Step(2*time.Second - time.Nanosecond)
		if err := term.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		check(t, term, ends, ErrReleased)
	})
	t.Run("renewal answered after the deadline", func(t *testing.T) {
		term, srv, _, ends := setup(t)
		srv.delay = 2 * time.Second
		if err := term.Renew(context.Background()); !errors.Is(err, ErrLocalDeadline) {
			t.Fatalf("renew: %v", err)
		}
		check(t, term, ends, ErrLocalDeadline)
		if err := term.Release(context.Background()); err != nil || srv.releases != 1 {
			t.Fatalf("release: %v (%d calls)", err, srv.releases)
		}
		check(t, term, ends, ErrLocalDeadline)
	})
	t.Run("lost, answered after the deadline", func(t *testing.T) {
		term, srv, _, ends := setup(t)
		srv.delay, srv.status = 2*time.Second, "lapsed"
		if err := term.Renew(context.Background()); !errors.Is(err, ErrLapsed) {
			t.Fatalf("renew: %v", err)
		}
		check(t, term, ends, ErrLocalDeadline)
		// The server said the grant is gone: no release.
		if err := term.Release(context.Background()); !errors.Is(err, ErrLapsed) || srv.releases != 0 {
			t.Fatalf("release: %v (%d calls)", err, srv.releases)
		}
	})
	t.Run("lost, answered before the deadline", func(t *testing.T) {
		term, srv, _, ends := setup(t)
		srv.delay, srv.status = 2*time.Second-time.Nanosecond, "lapsed"
		if err := term.Renew(context.Background()); !errors.Is(err, ErrLapsed) {
			t.Fatalf("renew: %v", err)
		}
		check(t, term, ends, ErrLapsed)
	})
}

// TestTermRenewedGrantPastItsDeadline: the server's clock jumps past the
// renewed expiry during the renewal (the answer's expiry is already behind
// the server's clock): the renewed grant is past its own deadline when the
// answer comes, and the term ends at once with ErrLocalDeadline, not later
// by its timer nor by the release that follows.
func TestTermRenewedGrantPastItsDeadline(t *testing.T) {
	c, srv := fakeClient(t)
	var ends []endReport
	term, err := c.Begin(grantAt(c, 3*time.Second), 0, func(tok Token, cause error) { ends = append(ends, endReport{tok, cause}) })
	if err != nil {
		t.Fatal(err)
	}
	srv.jump = time.Hour
	if err := term.Renew(context.Background()); !errors.Is(err, ErrLocalDeadline) {
		t.Fatalf("renew: %v", err)
	}
	if !errors.Is(term.Err(), ErrLocalDeadline) || len(ends) != 1 {
		t.Fatalf("after the renewal the term is %v (reports %v), want ended with ErrLocalDeadline", term.Err(), ends)
	}
	if err := term.Release(context.Background()); err != nil || srv.releases != 1 {
		t.Fatalf("release: %v (%d calls)", err, srv.releases)
	}
	if !errors.Is(term.Err(), ErrLocalDeadline) || len(ends) != 1 {
		t.Fatalf("after the release the term is %v (reports %v)", term.Err(), ends)
	}
}

func TestTermArrivedTooLate(t *testing.T) {
	c, srv := fakeClient(t)
	clk := c.clock.(*clocktesting.FakeClock)
	g := grantAt(c, time.Second)
	clk.Step(time.Second) // the answer took the whole TTL
	term, err := c.Begin(g, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(term.Err(), ErrLocalDeadline) {
		t.Fatalf("term of a grant past its deadline: %v", term.Err())
	}
	if err := term.Release(context.Background()); err != nil || srv.releases != 1 {
		t.Fatalf("release: %v (%d calls)", err, srv.releases)
	}
	if _, err := c.Begin(grantAt(c, time.Millisecond), 0, nil); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("term of a 1ms grant: %v", err)
	}
}

// TestTermEndReportedBeforeDone: while the end is being reported, Done stays
// open and Release and End wait for the report to finish.
func TestTermEndReportedBeforeDone(t *testing.T) {
	c, _ := fakeClient(t)
	clk := c.clock.(*clocktesting.FakeClock)
	entered, unblock := make(chan struct{}), make(chan struct{})
	term, err := c.Begin(grantAt(c, time.Second), 0, func(Token, error) {
		close(entered)
		<-unblock
	})
	if err != nil {
		t.Fatal(err)
	}
	go clk.Step(time.Second)
	<-entered
	if term.Err() == nil {
		t.Fatal("contexts not cancelled before the end is reported")
	}
	released := make(chan struct{})
	go func() {
		_ = term.Release(context.Background())
		close(released)
	}()
	select {
	case <-term.Done():
		t.Fatal("Done closed while the end is being reported")
	case <-released:
		t.Fatal("Release returned while the end is being reported")
	case <-time.After(50 * time.Millisecond): // a wait, not an assertion on time
	}
	close(unblock)
	<-term.Done()
	<-released
}

// TestTermContext: a context of an ended term, or from a done parent, is
// done when Context returns; the parent's cause and deadline carry over.
func TestTermContext(t *testing.T) {
	c, _ := fakeClient(t)
	clk := c.clock.(*clocktesting.FakeClock)
	term, err := c.Begin(grantAt(c, time.Minute), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := errors.New("parent stopped")
	parent, cancelParent := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancelParent(stop)
	ctx, cancel := term.Context(parent)
	defer cancel()
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), stop) {
		t.Fatalf("context from a done parent: %v, %v", ctx.Err(), context.Cause(ctx))
	}
	if ctx.Value(ctxKey{}) != "v" {
		t.Fatal("parent's values lost")
	}

	early := clk.Now().Add(time.Second)
	parent2, cancel2 := context.WithDeadline(context.Background(), early)
	defer cancel2()
	ctx2, cancel3 := term.Context(parent2)
	defer cancel3()
	if d, _ := ctx2.Deadline(); !d.Equal(early) {
		t.Fatalf("deadline %v, want the parent's earlier %v", d, early)
	}
	live, cancel4 := term.Context(context.Background())
	defer cancel4()
	term.End(fmt.Errorf("gone: %w", ErrLost))
	if live.Err() == nil || !errors.Is(context.Cause(live), ErrLost) {
		t.Fatal("term's end did not reach its context synchronously")
	}
	ended, cancel5 := term.Context(context.Background())
	defer cancel5()
	if ended.Err() == nil {
		t.Fatal("context of an ended term is live")
	}
}

type ctxKey struct{}
