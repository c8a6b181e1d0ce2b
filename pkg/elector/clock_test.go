package elector_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/lease"
)

// TestDeadlineAndCheckOnTheInjectedClock: the elector's term deadline and
// its health check run on the client's clock. With a fake clock set to the
// term's deadline the leader context ends (lease.ErrLocalDeadline) at once;
// Check tolerates a callback that has not returned for HealthTolerance past
// the deadline and fails beyond it. No sleeps: only the fake clock moves.
func TestDeadlineAndCheckOnTheInjectedClock(t *testing.T) {
	dsn := installed(t, nil)
	fake := clocktesting.NewFakeClock(time.Now())
	client := lease.New(newPool(t, dsn)).WithClock(fake)
	started := make(chan context.Context, 1)
	release := make(chan struct{})
	el, err := elector.New(client, elector.Config{
		Key: "fake-clock", Identity: "me", TTL: time.Minute, HealthTolerance: 5 * time.Second,
		Callbacks: elector.Callbacks{OnStartedLeading: func(ctx context.Context) {
			started <- ctx
			<-release // a callback slow to return
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	defer func() {
		close(release)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	lctx := <-started
	deadline := el.Status().Deadline
	if d, ok := lctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Fatalf("leader context deadline %v %v, want the term's %v", d, ok, deadline)
	}
	if err := el.Check(nil); err != nil {
		t.Fatalf("Check while leading: %v", err)
	}
	fake.SetTime(deadline)
	<-lctx.Done()
	if !errors.Is(context.Cause(lctx), lease.ErrLocalDeadline) {
		t.Fatalf("cause %v, want lease.ErrLocalDeadline", context.Cause(lctx))
	}
	fake.SetTime(deadline.Add(5 * time.Second))
	if err := el.Check(nil); err != nil {
		t.Fatalf("Check within HealthTolerance of the deadline: %v", err)
	}
	fake.SetTime(deadline.Add(5*time.Second + time.Millisecond))
	if err := el.Check(nil); err == nil {
		t.Fatal("Check passed with the callback running past the deadline + HealthTolerance")
	}
}

// lateAnswers steps the fake clock by steps[call] as the first answer of
// each call named in steps arrives: an answer that took that long on the
// client's clock.
type lateAnswers struct {
	*pgxpool.Pool
	clk   *clocktesting.FakeClock
	steps map[string]time.Duration
	mu    sync.Mutex
	late  map[string]bool
}

func (q *lateAnswers) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r := q.Pool.QueryRow(ctx, sql, args...)
	for call, step := range q.steps {
		if !strings.Contains(sql, call) {
			continue
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		if !q.late[call] {
			q.late[call] = true
			return lateRow{r, q.clk, step}
		}
	}
	return r
}

type lateRow struct {
	pgx.Row
	clk  *clocktesting.FakeClock
	step time.Duration
}

func (r lateRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.clk.Step(r.step)
	return err
}

// TestLateGrantAskedAgainAtOnce: a grant whose answer came with too little
// of its TTL left, and whose renewal came after the grant's end, is asked
// for again at once, not after RetryInterval: the elector leads with a
// whole term while the clock stands still (a sleep on the fake clock would
// never end).
func TestLateGrantAskedAgainAtOnce(t *testing.T) {
	dsn := installed(t, nil)
	const ttl = time.Minute
	fake := clocktesting.NewFakeClock(time.Now())
	client := lease.New(&lateAnswers{Pool: newPool(t, dsn), clk: fake, late: map[string]bool{},
		steps: map[string]time.Duration{"lease.acquire(": ttl - 5*time.Second, "lease.renew(": ttl}}).WithClock(fake)
	started := make(chan context.Context, 1)
	el, err := elector.New(client, elector.Config{
		Key: "late", Identity: "me", TTL: ttl,
		Callbacks: elector.Callbacks{OnStartedLeading: func(ctx context.Context) { started <- ctx }},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("no term after a late grant while the clock stood still: the elector slept instead of asking again")
	}
	if left := el.Status().Deadline.Sub(fake.Now()); left < ttl/2 {
		t.Fatalf("the term ends in %v, want at least half the TTL (%v)", left, ttl/2)
	}
}
