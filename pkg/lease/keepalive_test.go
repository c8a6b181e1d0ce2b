package lease

// The keep-alive on a fake clock, with the fake server of term_test.go:
// every wait is on an event (a renewal observed, a timer armed), and only
// the test moves the clock.

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// renewal is one call of KeepAliveOptions.Observe.
type renewal struct {
	key  string
	took time.Duration
	err  error
}

func observer() (chan renewal, func(*Term, time.Duration, error)) {
	ch := make(chan renewal, 64)
	return ch, func(t *Term, took time.Duration, err error) { ch <- renewal{t.Grant().Key, took, err} }
}

// waitWaiters waits until n timers wait on clk: every goroutine of the
// test has armed what it waits for.
func waitWaiters(t *testing.T, clk *clocktesting.FakeClock, n int) {
	t.Helper()
	bound := time.Now().Add(time.Minute)
	for clk.Waiters() != n {
		if time.Now().After(bound) {
			t.Fatalf("%d timers on the clock, want %d", clk.Waiters(), n)
		}
		runtime.Gosched()
	}
}

func next(t *testing.T, ch chan renewal) renewal {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(time.Minute):
		t.Fatal("no renewal observed")
		return renewal{}
	}
}

func grantOf(c *Client, key string, ttl time.Duration) Grant {
	now := c.clock.Now()
	return newGrant(Token{Key: key, Owner: "o", Epoch: 7}, now.Add(ttl), ttl, now, now)
}

// The keep-alive renews each RenewInterval (TTL/3) after the last renewal,
// moves the deadline, and returns nil, the term still live, when its
// context ends.
func TestKeepAliveRenewsEveryThirdOfTheTTL(t *testing.T) {
	c, s := fakeClient(t)
	clk := s.clk
	term, err := c.Begin(grantAt(c, 9*time.Second), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, obs := observer()
	ctx, cancel := context.WithCancel(context.Background())
	ret := make(chan error, 1)
	go func() { ret <- term.KeepAlive(ctx, KeepAliveOptions{Observe: obs}) }()
	for i := range 3 {
		waitWaiters(t, clk, 2) // the term's deadline and the keep-alive's timer
		clk.Step(3*time.Second - time.Nanosecond)
		if len(ch) != 0 || s.renews != i {
			t.Fatalf("round %d: a renewal before TTL/3", i)
		}
		clk.Step(time.Nanosecond)
		if r := next(t, ch); r.err != nil || r.key != "k" {
			t.Fatalf("round %d: %+v", i, r)
		}
		if want := clk.Now().Add(9*time.Second - 109*time.Millisecond); !term.Deadline().Equal(want) {
			t.Fatalf("round %d: deadline %v, want %v", i, term.Deadline(), want)
		}
	}
	waitWaiters(t, clk, 2)
	cancel()
	if err := <-ret; err != nil {
		t.Fatalf("KeepAlive after its context ended: %v, want nil", err)
	}
	if term.Err() != nil || clk.Waiters() != 1 {
		t.Fatalf("after the keep-alive: term %v, %d timers (want the term's deadline alone)", term.Err(), clk.Waiters())
	}
}

// A failed renewal is retried at RetryInterval (default Interval/2), and
// the Interval resumes after a success.
func TestKeepAliveRetries(t *testing.T) {
	c, s := fakeClient(t)
	clk := s.clk
	term, _ := c.Begin(grantAt(c, 9*time.Second), 0, nil) // deadline 8.891s
	ch, obs := observer()
	ctx, cancel := context.WithCancel(context.Background())
	ret := make(chan error, 1)
	go func() { ret <- term.KeepAlive(ctx, KeepAliveOptions{Observe: obs}) }()
	s.setDown(true)
	waitWaiters(t, clk, 2)
	clk.Step(3 * time.Second)
	if r := next(t, ch); r.err == nil || errors.Is(r.err, ErrLost) {
		t.Fatalf("renewal on a server down: %v", r.err)
	}
	for i := range 3 {
		if i == 2 {
			s.setDown(false)
		}
		waitWaiters(t, clk, 2)
		clk.Step(1500*time.Millisecond - time.Nanosecond)
		if len(ch) != 0 {
			t.Fatal("a retry before RetryInterval")
		}
		clk.Step(time.Nanosecond)
		if r := next(t, ch); (r.err == nil) != (i == 2) {
			t.Fatalf("retry %d: %v", i, r.err)
		}
	}
	// Renewed at 7.5s: the next renewal comes at the Interval again.
	waitWaiters(t, clk, 2)
	clk.Step(3*time.Second - time.Nanosecond)
	if len(ch) != 0 {
		t.Fatal("a renewal before the Interval after a success")
	}
	clk.Step(time.Nanosecond)
	if r := next(t, ch); r.err != nil {
		t.Fatal(r.err)
	}
	waitWaiters(t, clk, 2)
	cancel()
	if err := <-ret; err != nil {
		t.Fatal(err)
	}
}

// A retry never waits past the term's deadline: a keep-alive that cannot
// renew ends with the term at its deadline and returns ErrLocalDeadline.
func TestKeepAliveRetryIsCutToTheDeadline(t *testing.T) {
	c, s := fakeClient(t)
	clk := s.clk
	term, _ := c.Begin(grantAt(c, 9*time.Second), 0, nil) // deadline 8.891s
	ch, obs := observer()
	ret := make(chan error, 1)
	go func() {
		ret <- term.KeepAlive(context.Background(), KeepAliveOptions{RetryInterval: time.Hour, Observe: obs})
	}()
	s.setDown(true)
	waitWaiters(t, clk, 2)
	clk.Step(3 * time.Second)
	if r := next(t, ch); r.err == nil {
		t.Fatal("renewal succeeded on a server down")
	}
	waitWaiters(t, clk, 2)
	clk.Step(6*time.Second - 109*time.Millisecond - time.Nanosecond)
	if term.Err() != nil || len(ch) != 0 {
		t.Fatalf("before the deadline: term %v, %d renewals", term.Err(), len(ch))
	}
	clk.Step(time.Nanosecond)
	if err := <-ret; !errors.Is(err, ErrLocalDeadline) {
		t.Fatalf("KeepAlive of an unrenewable term: %v, want ErrLocalDeadline", err)
	}
}

// A renewal the server refuses ends the term; KeepAlive returns its cause.
func TestKeepAliveReturnsTheLoss(t *testing.T) {
	c, s := fakeClient(t)
	term, _ := c.Begin(grantAt(c, 9*time.Second), 0, nil)
	ret := make(chan error, 1)
	go func() { ret <- term.KeepAlive(context.Background(), KeepAliveOptions{Interval: time.Second}) }()
	s.mu.Lock()
	s.status = "lapsed"
	s.mu.Unlock()
	waitWaiters(t, s.clk, 2)
	s.clk.Step(time.Second)
	err := <-ret
	if !errors.Is(err, ErrLapsed) || !errors.Is(term.Err(), ErrLapsed) {
		t.Fatalf("KeepAlive %v, term %v: want ErrLapsed", err, term.Err())
	}
	if s.clk.Waiters() != 0 {
		t.Fatalf("%d timers left", s.clk.Waiters())
	}
}

// A set renews its terms in one renew_many per round, picks up terms added
// while it runs without moving its rounds, drops removed and lost terms,
// and waits for Add once empty.
func TestKeepAliveSet(t *testing.T) {
	c, s := fakeClient(t)
	clk := s.clk
	begin := func(key string) *Term {
		term, err := c.Begin(grantOf(c, key, 9*time.Second), 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return term
	}
	ta, tb := begin("a"), begin("b")
	ch, obs := observer()
	set := c.NewKeepAliveSet(KeepAliveOptions{Observe: obs})
	set.Add(tb)
	set.Add(ta)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); set.Run(ctx) }()

	round := func(n int) []renewal {
		var out []renewal
		for range n {
			out = append(out, next(t, ch))
		}
		return out
	}
	waitWaiters(t, clk, 3)
	clk.Step(2 * time.Second)
	tc := begin("c") // added between rounds: renewed at the set's next round
	set.Add(tc)
	clk.Step(time.Second)
	if got := round(3); got[0].key != "a" || got[1].key != "b" || got[2].key != "c" {
		t.Fatalf("round 1: %+v", got)
	}
	if want := [][]string{{"a", "b", "c"}}; !slices.EqualFunc(s.batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", s.batches, want)
	}

	// b is lost at the next round and leaves the set; a is removed.
	s.setLapsed("b")
	waitWaiters(t, clk, 4)
	clk.Step(3 * time.Second)
	got := round(3)
	if !errors.Is(got[1].err, ErrLapsed) || got[0].err != nil || got[2].err != nil {
		t.Fatalf("round 2: %+v", got)
	}
	if !errors.Is(tb.Err(), ErrLapsed) {
		t.Fatalf("the lost term: %v", tb.Err())
	}
	set.Remove(ta)
	if ts := set.Terms(); len(ts) != 1 || ts[0] != tc {
		t.Fatalf("terms after a loss and a removal: %v", ts)
	}
	waitWaiters(t, clk, 3) // a's and c's deadlines, the set's timer
	clk.Step(3 * time.Second)
	if r := round(1); r[0].key != "c" || len(s.batches) != 3 || !slices.Equal(s.batches[2], []string{"c"}) {
		t.Fatalf("round 3: %+v, batches %v", r, s.batches)
	}

	// Empty (c lost): no timer until a term is added.
	s.setLapsed("c")
	waitWaiters(t, clk, 3)
	clk.Step(3 * time.Second)
	round(1)
	waitWaiters(t, clk, 1) // a's deadline alone: the set waits for Add
	d := begin("d")
	set.Add(d)
	waitWaiters(t, clk, 3)
	clk.Step(3 * time.Second)
	if r := round(1); r[0].key != "d" || r[0].err != nil {
		t.Fatalf("after Add to an empty set: %+v", r)
	}
	cancel()
	<-stopped
}

func (s *fakeServer) setDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

func (s *fakeServer) setLapsed(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lapsed == nil {
		s.lapsed = map[string]bool{}
	}
	s.lapsed[key] = true
}
