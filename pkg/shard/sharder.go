// Package shard spreads one controller's objects over every replica: N
// shards fixed per controller, each a pg_lease key with its own epoch,
// assigned to the live members by rendezvous hashing and held by one
// replica at a time.
//
// Membership and assignment come from the database alone. Each replica
// holds a member key (<controller>/member/<identity>) and renews it with
// all its shard keys in one statement (lease.renew_many). A replica reads
// the live members from lease.list and computes the owner of every shard
// with Assign: rendezvous hashing needs no ring or table to store, every
// replica computes the same answer from the same members, and a change of
// members moves only the shards that must move.
//
// Rebalancing has no overlap and no orphan:
//   - a replica that should no longer own shard s first cancels the
//     shard's context and waits for the work running under it, then
//     releases the key; the new owner acquires it after the release;
//   - a replica that stops does the same for all its shards, then
//     releases its member key;
//   - a crashed replica's keys lapse at their server expiry, and the
//     others take its shards over then.
//
// Work under shard s runs in the context Begin returns: it carries the
// shard's fencing token (lease.TokenFromContext), so a guard (pkg/fence)
// rejects the writes of a former owner of that shard.
package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

// takeConcurrency bounds the acquires one round runs at once.
const takeConcurrency = 8

// MaxShards is the most shards of one controller: every shard key and the
// member key are renewed in one lease.renew_many call.
const MaxShards = lease.MaxRenewMany - 1

// ErrInvalidConfig matches every error of New for a bad Config.
var ErrInvalidConfig = errors.New("shard: invalid config")

// ErrRebalanced is the cause of a shard context cancelled because the shard
// moved to another replica, or because this replica stops.
var ErrRebalanced = errors.New("shard: shard moved to another replica")

// Config configures a Sharder. Client, Controller and Shards are required.
type Config struct {
	Client *lease.Client
	// Controller names the controller: the prefix of its keys.
	Controller string
	// Shards is N, fixed for the life of the controller: 1 to MaxShards.
	Shards int
	// Identity is this replica's member name and the owner of its keys.
	// It must be unique among live replicas. Default lease.DefaultOwner().
	Identity string
	// TTL of the member and shard keys. Default 10 s.
	TTL time.Duration
	// RenewEvery is the period of the batch renewal. Default TTL/3.
	RenewEvery time.Duration
	// Margin of each term (lease.CheckMargin). Zero: the default.
	Margin time.Duration
	// Poll is how often a replica retries a shard that it should own but
	// another replica still holds (it is being released). Default 50 ms.
	Poll time.Duration
	// Waiter, when set, wakes the replica at once when a shard key is
	// released and when a replica joins or leaves. Without it the replica
	// sees such changes at its next Poll or RenewEvery.
	Waiter *lease.Waiter
	// OnAcquired is called after shard s is acquired, for example to
	// enqueue its objects again; calls for several shards may run at once.
	// Must not block.
	OnAcquired func(s int)
	// Logger; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) fill() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("Client must not be nil"))
	}
	if err := lease.CheckKey(c.Controller); err != nil {
		errs = append(errs, fmt.Errorf("Controller: %w", err))
	}
	if c.Shards < 1 || c.Shards > MaxShards {
		errs = append(errs, fmt.Errorf("Shards must be 1 to %d, got %d", MaxShards, c.Shards))
	}
	if c.Identity == "" {
		c.Identity = lease.DefaultOwner()
	}
	if err := lease.CheckOwner(c.Identity); err != nil {
		errs = append(errs, fmt.Errorf("Identity: %w", err))
	}
	if err := lease.CheckKey(MemberKey(c.Controller, c.Identity)); err != nil {
		errs = append(errs, fmt.Errorf("member key: %w", err))
	}
	if c.TTL == 0 {
		c.TTL = 10 * time.Second
	}
	if _, err := lease.CheckMargin(c.TTL, c.Margin); err != nil {
		errs = append(errs, fmt.Errorf("TTL and Margin: %w", err))
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.TTL / 3
	}
	if c.RenewEvery < 0 || c.RenewEvery >= c.TTL {
		errs = append(errs, fmt.Errorf("RenewEvery must be positive and below TTL (%v), got %v", c.TTL, c.RenewEvery))
	}
	if c.Poll == 0 {
		c.Poll = 50 * time.Millisecond
	}
	if c.Poll < 0 {
		errs = append(errs, fmt.Errorf("Poll must not be negative, got %v", c.Poll))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// Sharder holds one replica's member key and shard keys.
type Sharder struct {
	cfg     Config
	c       *lease.Client
	metrics *replicaMetrics
	kick    chan struct{}

	mu        sync.Mutex
	member    *lease.Term
	owned     map[int]*owned
	members   []string
	assign    []string
	lastRenew time.Time
	lastList  time.Time
	unowned   map[int]bool // shards nobody held at the last list
	stops     sync.WaitGroup
}

// owned is a shard this replica holds (or is releasing).
type owned struct {
	s        int
	term     *lease.Term
	inflight sync.WaitGroup // work begun under the term (Begin)
	stopping bool
}

// New validates cfg and returns a Sharder; Run starts it.
func New(cfg Config) (*Sharder, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Sharder{cfg: cfg, c: cfg.Client, kick: make(chan struct{}, 1),
		owned: map[int]*owned{}, unowned: map[int]bool{},
		metrics: newReplicaMetrics(cfg.Controller, cfg.Identity)}, nil
}

// Identity is this replica's member name.
func (r *Sharder) Identity() string { return r.cfg.Identity }

// Shards is N.
func (r *Sharder) Shards() int { return r.cfg.Shards }

// Of returns the shard of namespace/name.
func (r *Sharder) Of(namespace, name string) int { return Of(namespace, name, r.cfg.Shards) }

// Owned lists the shards this replica holds and acts under now, in order.
func (r *Sharder) Owned() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for s, o := range r.owned {
		if !o.stopping && o.term.Err() == nil {
			out = append(out, s)
		}
	}
	sort.Ints(out)
	return out
}

// Owns reports whether this replica acts under shard s now.
func (r *Sharder) Owns(s int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.owned[s]
	return o != nil && !o.stopping && o.term.Err() == nil
}

// Begin returns a context for work on shard s, carrying the shard's fencing
// token and cancelled (cause ErrRebalanced, or the term's end) when this
// replica stops owning s; ok is false when it does not own s now. Call
// done when the work ends: the replica releases s only after every done,
// so a successor never starts while work of the former owner runs here.
func (r *Sharder) Begin(parent context.Context, s int) (ctx context.Context, done func(), ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.owned[s]
	if o == nil || o.stopping || o.term.Err() != nil {
		return nil, nil, false
	}
	o.inflight.Add(1)
	ctx, cancel := o.term.Context(parent)
	var once sync.Once
	return ctx, func() { once.Do(func() { cancel(); o.inflight.Done() }) }, true
}

// Run holds the member key and the assigned shard keys until ctx ends, then
// stops every shard's work, releases the shards and the member key, and
// returns nil. It returns early only for an error no retry can fix (another
// process holds this replica's identity).
func (r *Sharder) Run(ctx context.Context) error {
	var changes <-chan lease.Event
	if r.cfg.Waiter != nil {
		keys := []string{changedKey(r.cfg.Controller)}
		for s := range r.cfg.Shards {
			keys = append(keys, Key(r.cfg.Controller, s))
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		changes = r.cfg.Waiter.Watch(wctx, keys...)
	}
	clk := r.c.Clock()
	for {
		next, err := r.round(ctx)
		if err != nil && ctx.Err() == nil {
			r.leave()
			return err
		}
		t := clk.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(context.Cause(ctx), errCrash) {
				return nil // tests: a replica that stops renewing, as a crashed one
			}
			r.leave()
			return nil
		case <-t.C():
		case <-r.kick:
			t.Stop()
		case _, ok := <-changes:
			t.Stop()
			if !ok {
				changes = nil
			}
		}
	}
}

func (r *Sharder) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// errCrash, as the cause of Run's context, stops the loop without releasing
// anything: tests simulate a crashed replica with it.
var errCrash = errors.New("shard: crash")

// ErrIdentityTaken: another process holds this replica's member key.
var ErrIdentityTaken = errors.New("shard: another process holds this replica's member key")

// round is one step of the loop: the member key, the batch renewal when
// due, the members and shards as the database has them, the shards to
// give up and to take. It returns when to run again.
func (r *Sharder) round(ctx context.Context) (time.Duration, error) {
	clk := r.c.Clock()
	warn := func(msg string, args ...any) {
		if ctx.Err() == nil { // once stopping, the errors are the cancellation's
			r.cfg.Logger.Warn(msg, args...)
		}
	}
	next := r.cfg.RenewEvery

	if err := r.ensureMember(ctx); err != nil {
		if errors.Is(err, ErrIdentityTaken) {
			return 0, err
		}
		warn("shard: member key", "controller", r.cfg.Controller, "err", err)
		return r.cfg.Poll, nil
	}

	// The batch renewal of the member key and every live shard key.
	now := clk.Now()
	r.mu.Lock()
	due := now.Sub(r.lastRenew) >= r.cfg.RenewEvery
	terms := []*lease.Term{r.member}
	if due {
		for _, o := range r.owned {
			if !o.stopping && o.term.Err() == nil {
				terms = append(terms, o.term)
			}
		}
	}
	r.mu.Unlock()
	if due {
		errs := r.c.RenewTerms(ctx, terms)
		for i, err := range errs {
			if err != nil {
				warn("shard: renewal", "key", terms[i].Grant().Key, "err", err)
			}
		}
		if errs[0] == nil {
			r.mu.Lock()
			r.lastRenew = now
			r.mu.Unlock()
		} else {
			next = r.cfg.Poll // retried soon; a lost member key is acquired again
		}
	} else {
		next = r.cfg.RenewEvery - now.Sub(r.lastRenew)
	}

	// Shards whose term ended (lost, or its deadline passed): stop them.
	r.mu.Lock()
	for _, o := range r.owned {
		if !o.stopping && o.term.Err() != nil {
			r.stopLocked(o, o.term.Err())
		}
	}
	r.mu.Unlock()

	states, err := r.c.List(ctx)
	if err != nil {
		warn("shard: list", "controller", r.cfg.Controller, "err", err)
		return min(next, r.cfg.Poll), nil
	}
	listed := clk.Now()
	var members []string
	shardState := make(map[int]lease.State)
	for _, st := range states {
		if m, ok := memberOf(r.cfg.Controller, st.Key); ok && st.Held {
			members = append(members, m)
			if m != r.cfg.Identity {
				if d := st.ExpiresLocal().Sub(listed); d > 0 {
					next = min(next, d) // a crashed member's keys lapse then
				}
			}
			continue
		}
		if s, ok := parseShard(r.cfg.Controller, st.Key, r.cfg.Shards); ok {
			shardState[s] = st
		}
	}
	assign := Assign(r.cfg.Shards, members)

	r.mu.Lock()
	r.members, r.assign = members, assign
	// Unowned time: a shard nobody held at two lists in a row was unowned
	// for the time between them, as far as this replica can tell.
	var unowned int
	for s := range r.cfg.Shards {
		st := shardState[s]
		if !st.Held {
			unowned++
			if r.unowned[s] && !r.lastList.IsZero() {
				r.metrics.unownedSeconds.Add(listed.Sub(r.lastList).Seconds())
			}
			r.unowned[s] = true
		} else {
			delete(r.unowned, s)
		}
	}
	r.lastList = listed
	r.metrics.unowned.Set(float64(unowned))
	r.metrics.members.Set(float64(len(members)))
	var take []int
	for s := range r.cfg.Shards {
		o := r.owned[s]
		switch {
		case assign == nil || assign[s] != r.cfg.Identity:
			if o != nil && !o.stopping {
				r.stopLocked(o, ErrRebalanced)
			}
		case o == nil:
			st := shardState[s]
			if st.Held && st.Owner != r.cfg.Identity {
				// A live former owner is releasing it: retry at the poll
				// (the release's notification may wake us sooner). A holder
				// that is no member any more crashed: its grant lapses at
				// its expiry.
				if slices.Contains(members, st.Owner) {
					next = min(next, r.cfg.Poll)
				} else if d := st.ExpiresLocal().Sub(listed); d > 0 {
					next = min(next, max(d, time.Millisecond))
				} else {
					next = min(next, r.cfg.Poll)
				}
				continue
			}
			take = append(take, s)
		}
	}
	r.mu.Unlock()

	// The shards to take, a few at a time: after a leave or a crash, a
	// replica may take many at once.
	var (
		wg     sync.WaitGroup
		failed atomic.Bool
		sem    = make(chan struct{}, takeConcurrency)
	)
	for _, s := range take {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := r.take(ctx, s); err != nil {
				warn("shard: acquire", "key", Key(r.cfg.Controller, s), "err", err)
				failed.Store(true)
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		next = min(next, r.cfg.Poll)
	}
	r.mu.Lock()
	r.metrics.owned.Set(float64(len(r.owned)))
	r.mu.Unlock()
	return max(next, time.Millisecond), nil
}

// ensureMember holds the member key: acquired at the first round and
// again whenever its term ended.
func (r *Sharder) ensureMember(ctx context.Context) error {
	r.mu.Lock()
	m := r.member
	r.mu.Unlock()
	if m != nil && m.Err() == nil {
		return nil
	}
	key := MemberKey(r.cfg.Controller, r.cfg.Identity)
	if m != nil {
		_ = m.Release(ctx) // an ended term may still hold the key
	}
	g, ok, err := r.c.Acquire(ctx, key, r.cfg.Identity, r.cfg.TTL)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrIdentityTaken, key)
	}
	t, err := r.c.Begin(g, r.cfg.Margin, nil)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.member = t
	r.lastRenew = r.c.Clock().Now()
	r.mu.Unlock()
	r.announce(ctx)
	return nil
}

// announce wakes the other replicas watching the controller's changed key:
// an acquire and a release of it, each notified.
func (r *Sharder) announce(ctx context.Context) {
	g, ok, err := r.c.Acquire(ctx, changedKey(r.cfg.Controller), r.cfg.Identity, time.Second)
	if err == nil && ok {
		_ = r.c.Release(ctx, g.Token)
	}
}

// take acquires shard s (wait 0) and begins its term.
func (r *Sharder) take(ctx context.Context, s int) error {
	g, ok, err := r.c.Acquire(ctx, Key(r.cfg.Controller, s), r.cfg.Identity, r.cfg.TTL)
	if err != nil || !ok {
		return err // not ok: taken by another meanwhile; the next round sees it
	}
	t, err := r.c.Begin(g, r.cfg.Margin, nil)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.owned[s] = &owned{s: s, term: t}
	r.mu.Unlock()
	r.metrics.rebalances.WithLabelValues("acquired").Inc()
	if r.cfg.OnAcquired != nil {
		r.cfg.OnAcquired(s)
	}
	return nil
}

// stopLocked stops shard o in the background: it cancels the shard's
// contexts (ending its term), waits for the work begun under it, releases
// the key unless the server said it is gone, and forgets the shard.
func (r *Sharder) stopLocked(o *owned, cause error) {
	o.stopping = true
	o.term.End(cause)
	kind := "released"
	if !errors.Is(cause, ErrRebalanced) {
		kind = "lost"
	}
	r.metrics.rebalances.WithLabelValues(kind).Inc()
	r.stops.Add(1)
	go func() {
		defer r.stops.Done()
		o.inflight.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
		defer cancel()
		if err := o.term.Release(ctx); err != nil && !errors.Is(err, lease.ErrLost) {
			r.cfg.Logger.Warn("shard: release", "key", o.term.Grant().Key, "err", err)
		}
		r.mu.Lock()
		if r.owned[o.s] == o {
			delete(r.owned, o.s)
		}
		r.metrics.owned.Set(float64(len(r.owned)))
		r.mu.Unlock()
		r.wake()
	}()
}

// leave stops every shard, waits for their releases, then releases the
// member key and announces the change.
func (r *Sharder) leave() {
	r.mu.Lock()
	for _, o := range r.owned {
		if !o.stopping {
			r.stopLocked(o, ErrRebalanced)
		}
	}
	m := r.member
	r.mu.Unlock()
	r.stops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
	defer cancel()
	if m != nil {
		_ = m.Release(ctx)
		r.announce(ctx)
	}
	r.metrics.owned.Set(0)
}

// Assignment is the last view of the members (sorted) and of the owner
// each shard should have (Assign over them).
func (r *Sharder) Assignment() (members []string, owners []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.members...), append([]string(nil), r.assign...)
}
