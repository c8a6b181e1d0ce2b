package lease

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// renewsPerTTL is the one default cadence of every keep-alive: a renewal
// each third of the TTL. After a renewal the term has its TTL less the
// margin (at most TTL/3) left, so a failed renewal leaves room for at
// least one more attempt before the deadline.
const renewsPerTTL = 3

// RenewInterval is the default pause between successful renewals of a
// grant of ttl: ttl/3. Term.KeepAlive and KeepAliveSet use it; pkg/elector
// and pkg/shard take it as their default.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / renewsPerTTL }

// KeepAliveOptions tune a keep-alive. The zero value takes the defaults.
type KeepAliveOptions struct {
	// Interval is the pause after a renewal that succeeded (or ended its
	// term). Default RenewInterval of the shortest TTL among the terms.
	Interval time.Duration
	// RetryInterval is the pause after a renewal that failed without
	// ending its term (a lost connection, a timeout), cut to the time left
	// before that term's deadline. Default Interval/2.
	RetryInterval time.Duration
	// Observe, when set, is called after every renewal of a term, on the
	// keep-alive's goroutine, with how long the call took and what the
	// renewal returned (Term.Renew's error; nil when it succeeded). It
	// must not block for long: renewals wait for it.
	Observe func(t *Term, took time.Duration, err error)
}

// KeepAlive renews t on the client's clock, every Interval after a
// successful renewal and every RetryInterval after a failed one, until t
// ends or ctx is done. It returns the term's cause (Err): nil when ctx
// ended first and the term still lasts. Ending ctx stops the renewals
// between two of them; a renewal in flight is not cancelled (it runs to
// its answer or the term's deadline), so KeepAlive returns after it. Each
// renewal is Term.Renew (lease.renew). One KeepAlive per term.
func (t *Term) KeepAlive(ctx context.Context, o KeepAliveOptions) error {
	live := func() []*Term {
		if t.Err() != nil {
			return nil
		}
		return []*Term{t}
	}
	renew := func(ctx context.Context, ts []*Term) []error { return []error{ts[0].Renew(ctx)} }
	t.c.keepAlive(ctx, o, t.done, nil, live, renew)
	return t.Err()
}

// KeepAliveSet keeps a changing set of terms alive in one statement per
// round (lease.renew_many): a controller that gains and loses keys adds
// and removes their terms while Run runs. Terms of one owner and one TTL
// go in one batch (at most MaxBatch keys each); an ended term leaves the
// set by itself. Its terms must be begun by its client (or one on the
// same Querier and clock) and hold distinct keys.
type KeepAliveSet struct {
	c    *Client
	o    KeepAliveOptions
	kick chan struct{} // a term was added

	mu    sync.Mutex
	terms map[*Term]struct{}
}

// NewKeepAliveSet returns an empty set whose Run renews its terms with c,
// at the cadence of o.
func (c *Client) NewKeepAliveSet(o KeepAliveOptions) *KeepAliveSet {
	return &KeepAliveSet{c: c, o: o, kick: make(chan struct{}, 1), terms: map[*Term]struct{}{}}
}

// Add puts t in the set; the next round renews it. Adding does not move
// the rounds of the terms already there.
func (s *KeepAliveSet) Add(t *Term) {
	s.mu.Lock()
	s.terms[t] = struct{}{}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Remove takes t out of the set; a renewal of it in flight still ends.
func (s *KeepAliveSet) Remove(t *Term) {
	s.mu.Lock()
	delete(s.terms, t)
	s.mu.Unlock()
}

// Terms returns the live terms of the set, in key order.
func (s *KeepAliveSet) Terms() []*Term {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Term, 0, len(s.terms))
	for t := range s.terms {
		if t.Err() != nil {
			delete(s.terms, t)
			continue
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Term) int { return cmp.Compare(a.Grant().Key, b.Grant().Key) })
	return out
}

// Run renews the set's terms until ctx is done, as Term.KeepAlive renews
// one: a round renews every live term, Interval after a round in which
// every renewal succeeded, and RetryInterval after one in which a renewal
// failed without ending its term. An empty set waits for Add. Ending ctx
// stops the rounds between two of them.
func (s *KeepAliveSet) Run(ctx context.Context) {
	s.c.keepAlive(ctx, s.o, nil, s.kick, s.Terms, s.renew)
}

// renew renews ts (in key order) in batches of one owner and one TTL.
func (s *KeepAliveSet) renew(ctx context.Context, ts []*Term) []error {
	type batch struct {
		owner string
		ttl   time.Duration
	}
	groups := map[batch][]int{}
	var order []batch
	for i, t := range ts {
		g := t.Grant()
		b := batch{g.Owner, g.TTL}
		if _, ok := groups[b]; !ok {
			order = append(order, b)
		}
		groups[b] = append(groups[b], i)
	}
	errs := make([]error, len(ts))
	for _, b := range order {
		idx := groups[b]
		for len(idx) > 0 {
			n := min(len(idx), MaxBatch)
			part := make([]*Term, n)
			for k, i := range idx[:n] {
				part[k] = ts[i]
			}
			for k, err := range s.c.RenewTerms(ctx, part) {
				errs[idx[k]] = err
			}
			idx = idx[n:]
		}
	}
	return errs
}

// keepAlive is the one renew loop of the repository. Each round renews
// live() with renew, then waits (on the client's clock) for the next
// round: o.Interval after a round without a failure that left its term
// live, o.RetryInterval (cut to the earliest such term's deadline) after
// one with. It returns when ctx or done (nil: never) ends. With no live
// term it waits for kick (nil: never). Renewals run on a context that ctx's
// end does not cancel.
func (c *Client) keepAlive(ctx context.Context, o KeepAliveOptions, done <-chan struct{}, kick <-chan struct{},
	live func() []*Term, renew func(context.Context, []*Term) []error) {
	rctx := context.WithoutCancel(ctx)
	var timer clock.Timer
	stop := func() {
		if timer != nil {
			timer.Stop()
			timer = nil
		}
	}
	defer stop()
	arm := func(d time.Duration) { timer = c.clock.NewTimer(d) }
	if ts := live(); len(ts) > 0 {
		arm(o.interval(ts))
	}
	for {
		var fire <-chan time.Time
		if timer != nil {
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-kick:
			if ts := live(); timer == nil && len(ts) > 0 {
				arm(o.interval(ts))
			}
			continue
		case <-fire:
			timer = nil
		}
		ts := live()
		if len(ts) == 0 {
			continue // wait for kick
		}
		start := c.clock.Now()
		errs := renew(rctx, ts)
		took := c.clock.Since(start)
		if o.Observe != nil {
			for i, t := range ts {
				o.Observe(t, took, errs[i])
			}
		}
		switch {
		case len(live()) > 0:
			arm(o.next(c.clock, ts, errs))
		case done != nil:
			return
		}
	}
}

// interval is the pause after a successful round over ts.
func (o KeepAliveOptions) interval(ts []*Term) time.Duration {
	if o.Interval > 0 {
		return o.Interval
	}
	ttl := ts[0].Grant().TTL
	for _, t := range ts[1:] {
		ttl = min(ttl, t.Grant().TTL)
	}
	return RenewInterval(ttl)
}

// next is the pause after a round that renewed ts with errs.
func (o KeepAliveOptions) next(clk clock.PassiveClock, ts []*Term, errs []error) time.Duration {
	d := o.interval(ts)
	var left time.Duration
	failed := false
	for i, t := range ts {
		if errs[i] == nil || t.Err() != nil {
			continue
		}
		l := t.Deadline().Sub(clk.Now())
		if !failed || l < left {
			left = l
		}
		failed = true
	}
	if !failed {
		return d
	}
	retry := o.RetryInterval
	if retry <= 0 {
		retry = d / 2
	}
	return min(retry, max(left, 0))
}
