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
//     releases the key;
//   - the release hands the key over in its own transaction (a
//     lease.candidate registration under the priority strategy): a joining
//     replica registers for the shards it will win before it announces
//     itself, and every replica registers for the shards it would get if
//     their owner left (the rendezvous runner-up), so a move leaves no
//     shard free; without a registration the key is freed and the new
//     owner acquires it;
//   - a replica that stops first releases its member key (the others
//     recompute without it while its work ends), then its shards;
//   - a crashed replica's keys lapse at their server expiry, and the
//     others take its shards over then: they wake at the latest local
//     bound of that expiry.
//
// Every process holds its keys under an owner of its own (Identity#random),
// so two processes never share a grant: a second process given the
// identity of a live replica sees its member key renewed by another owner
// and refuses to run (ErrIdentityTaken); a replica restarted after a crash
// waits for the old process's member key to lapse.
//
// Work under shard s runs in the context Begin returns: it carries the
// shard's fencing token (lease.TokenFromContext), so a guard (pkg/fence)
// rejects the writes of a former owner of that shard.
package shard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
)

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
	// Identity is this replica's member name. It must be unique among live
	// replicas: Run refuses an identity another live process holds.
	// Default lease.DefaultOwner().
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
	owner   string // the owner of this process's keys: Identity#<instance>
	metrics *replicaMetrics
	kick    chan struct{}

	mu       sync.Mutex
	member   *lease.Term
	owned    map[int]*owned
	members  []string
	assign   []string
	lastList time.Time
	unowned  map[int]bool        // shards nobody held at the last list
	handed   map[int]lease.Token // grants a handover gave this process, not taken yet
	stops    sync.WaitGroup

	// Touched by Run's goroutine only.
	cands    map[int]int32 // shard -> priority of this replica's candidacy
	strategy map[int]bool  // shard keys this process set the priority strategy on
	candsAt  time.Time     // local time of the last registration
	rival    lease.State   // another process's member key of this identity, last seen
}

// owned is a shard this replica holds (or is releasing).
type owned struct {
	s        int
	term     *lease.Term
	inflight sync.WaitGroup // work begun under the term (Begin)
	stopping bool
}

// The priorities of handover candidacies: a replica that Assign names for
// a shard it does not hold yet (it joined) comes before the runner-up
// (the replica that takes the shard when its owner leaves).
const (
	priorityAssigned int32 = 2
	priorityRunnerUp int32 = 1
)

// New validates cfg and returns a Sharder; Run starts it.
func New(cfg Config) (*Sharder, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	owner := cfg.Identity + "#" + hex.EncodeToString(b[:])
	if err := lease.CheckOwner(owner); err != nil {
		return nil, fmt.Errorf("%w: Identity: %w", ErrInvalidConfig, err)
	}
	return &Sharder{cfg: cfg, c: cfg.Client, owner: owner, kick: make(chan struct{}, 1),
		owned: map[int]*owned{}, unowned: map[int]bool{}, handed: map[int]lease.Token{},
		cands: map[int]int32{}, strategy: map[int]bool{},
		metrics: newReplicaMetrics(cfg.Controller, cfg.Identity)}, nil
}

// Identity is this replica's member name.
func (r *Sharder) Identity() string { return r.cfg.Identity }

// Owner is the owner of this process's member and shard keys: Identity, a
// "#" and a random instance name, so that no other process (a duplicate of
// the identity, or this replica restarted) ever holds the same grant.
func (r *Sharder) Owner() string { return r.owner }

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
// returns nil. It returns ErrIdentityTaken, holding nothing, when another
// live process holds this replica's member key.
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
	rctx, stopRenewing := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() { defer close(renewing); r.renewLoop(rctx) }()
	defer func() { stopRenewing(); <-renewing }()
	for {
		next, err := r.round(ctx)
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("shard: refusing to run", "controller", r.cfg.Controller,
				"identity", r.cfg.Identity, "err", err)
			stopRenewing()
			<-renewing
			r.leave()
			return err
		}
		t := clk.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			<-renewing
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

// renewLoop renews the member key and every live shard key in one
// statement (lease.renew_many) each RenewEvery until ctx ends. A failed
// renewal of the member key wakes the loop, which acquires it again.
func (r *Sharder) renewLoop(ctx context.Context) {
	clk := r.c.Clock()
	for {
		t := clk.NewTimer(r.cfg.RenewEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		r.mu.Lock()
		m := r.member
		if m == nil || m.Err() != nil {
			r.mu.Unlock()
			continue
		}
		terms := []*lease.Term{m}
		for _, o := range r.owned {
			if !o.stopping && o.term.Err() == nil {
				terms = append(terms, o.term)
			}
		}
		r.mu.Unlock()
		errs := r.c.RenewTerms(ctx, terms)
		for i, err := range errs {
			if err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("shard: renewal", "key", terms[i].Grant().Key, "err", err)
			}
		}
		if slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
			r.wake() // the round stops lost shards and acquires the member key again
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

// ErrIdentityTaken: another live process holds this replica's member key
// (two replicas were given one identity). Run returns it and holds nothing.
var ErrIdentityTaken = errors.New("shard: another live process holds this replica's member key")

// round is one step of the loop: the members and shards as the database
// has them, the member key, the shards to give up and to take, and the
// handover candidacies. It returns when to run again. Renewals run in
// renewLoop: a slow round never delays them.
func (r *Sharder) round(ctx context.Context) (time.Duration, error) {
	clk := r.c.Clock()
	warn := func(msg string, args ...any) {
		if ctx.Err() == nil { // once stopping, the errors are the cancellation's
			r.cfg.Logger.Warn(msg, args...)
		}
	}
	next := r.cfg.RenewEvery
	r.mu.Lock()
	m := r.member
	joined := m != nil && m.Err() == nil
	r.mu.Unlock()

	// Shards whose term ended (lost, or its deadline passed): stop them.
	r.mu.Lock()
	var ended []*owned
	for _, o := range r.owned {
		if !o.stopping && o.term.Err() != nil {
			r.endLocked(o, o.term.Err())
			ended = append(ended, o)
		}
	}
	r.releaseAfterWork(ended)
	r.mu.Unlock()

	states, err := r.c.List(ctx)
	if err != nil {
		warn("shard: list", "controller", r.cfg.Controller, "err", err)
		return min(next, r.cfg.Poll), nil
	}
	listed := clk.Now()
	var members []string
	memberOwners := map[string]bool{} // the holders of live member keys
	shardState := make(map[int]lease.State)
	for _, st := range states {
		if mem, ok := memberOf(r.cfg.Controller, st.Key); ok && st.Held {
			if mem == r.cfg.Identity && st.Owner != r.owner {
				continue // another process of this identity: ensureMember decides
			}
			members = append(members, mem)
			memberOwners[st.Owner] = true
			if mem != r.cfg.Identity {
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

	// The member key: acquired at the first round, and again when its term
	// ended. The others learn of it from announce, after the candidacies.
	joining := !joined
	if joining {
		if !slices.Contains(members, r.cfg.Identity) {
			members = append(members, r.cfg.Identity)
		}
		// Registered for the shards this replica will win before the
		// others see it: their releases then hand those shards over.
		win := Assign(r.cfg.Shards, members)
		cands := map[int]int32{}
		for s, o := range win {
			if st := shardState[s]; o == r.cfg.Identity && st.Held && st.Owner != r.owner {
				cands[s] = priorityAssigned
			}
		}
		if err := r.candidacies(ctx, cands, true); err != nil {
			warn("shard: handover candidacies", "controller", r.cfg.Controller, "err", err)
		}
		wait, err := r.ensureMember(ctx)
		if err != nil {
			if err := r.candidacies(ctx, nil, false); err != nil {
				warn("shard: handover candidacies", "controller", r.cfg.Controller, "err", err)
			}
			if errors.Is(err, ErrIdentityTaken) {
				return 0, err
			}
			warn("shard: member key", "controller", r.cfg.Controller, "err", err)
			return max(min(next, wait), time.Millisecond), nil
		}
		memberOwners[r.owner] = true
		r.announce(ctx)
	}
	assign, second := ranked(r.cfg.Shards, members)

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
	var moving []*owned
	var stray []lease.Token
	cands := map[int]int32{}
	for s := range r.cfg.Shards {
		o := r.owned[s]
		st := shardState[s]
		mine := assign[s] == r.cfg.Identity
		switch {
		case !mine:
			if o != nil && !o.stopping {
				r.endLocked(o, ErrRebalanced)
				moving = append(moving, o)
			}
			if o == nil && st.Held && st.Owner == r.owner {
				// Handed to this replica by a release that saw another
				// assignment: hand it on.
				stray = append(stray, lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch})
			}
			if second[s] == r.cfg.Identity {
				cands[s] = priorityRunnerUp
			}
		case o == nil:
			if st.Held && st.Owner != r.owner {
				cands[s] = priorityAssigned
				// A live member holds it: it is releasing it, and a release
				// notifies (with a Waiter); poll as well. A holder that is
				// no member left or crashed: its grant lapses at its
				// expiry, the latest bound on this clock.
				d := st.ExpiresLocal().Sub(listed)
				switch {
				case memberOwners[st.Owner] || d <= 0:
					next = min(next, r.cfg.Poll)
				case r.cfg.Waiter == nil:
					next = min(next, r.cfg.Poll, d)
				default:
					next = min(next, max(d, time.Millisecond))
				}
				continue
			}
			if st.Held && st.Owner == r.owner {
				r.handed[s] = lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch}
			}
			take = append(take, s)
		}
	}
	r.releaseAfterWork(moving)
	r.mu.Unlock()

	// The shards to take, in one statement: after a leave or a crash, a
	// replica may take many at once. Then the strays, in one statement.
	takeAt := clk.Now()
	if err := r.take(ctx, take); err != nil {
		warn("shard: acquire", "controller", r.cfg.Controller, "shards", len(take), "err", err)
		next = min(next, r.cfg.Poll)
	}
	if len(take) > 0 {
		r.cfg.Logger.Info("shard: took", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
			"shards", len(take), "list_age", takeAt.Sub(listed), "took", clk.Since(takeAt))
	}
	if errs, err := r.c.ReleaseMany(ctx, stray); err != nil {
		warn("shard: release", "controller", r.cfg.Controller, "shards", len(stray), "err", err)
	} else {
		for i, err := range errs {
			if err != nil && !errors.Is(err, lease.ErrLost) {
				warn("shard: release", "key", stray[i].Key, "err", err)
			}
		}
	}
	if err := r.candidacies(ctx, cands, clk.Since(r.candsAt) >= r.cfg.RenewEvery); err != nil {
		warn("shard: handover candidacies", "controller", r.cfg.Controller, "err", err)
	}
	r.mu.Lock()
	r.metrics.owned.Set(float64(len(r.owned)))
	r.mu.Unlock()
	return max(next, time.Millisecond), nil
}

// candidacies registers this replica as the handover candidate of the
// shards in want (with their priorities) and withdraws the others: a
// release of such a shard by its owner grants it here in the same
// transaction, so the shard is never free. Registrations last a TTL and
// are renewed with the batch renewal (refresh) or when want changes.
func (r *Sharder) candidacies(ctx context.Context, want map[int]int32, refresh bool) error {
	changed := len(want) != len(r.cands)
	for s, p := range want {
		changed = changed || r.cands[s] != p
	}
	if !changed && !(refresh && len(want) > 0) {
		return nil
	}
	// A release hands a key over only under a strategy: priority, set once
	// per key by this process (another role's strategy stays).
	var errs []error
	var unset []string
	for s := range want {
		if !r.strategy[s] {
			unset = append(unset, Key(r.cfg.Controller, s))
		}
	}
	if err := r.c.SetStrategyMany(ctx, unset, lease.StrategyPriority); err != nil {
		// One key refused (another role's strategy stays): key by key.
		var set []string
		for _, k := range unset {
			if _, err := r.c.SetStrategy(ctx, k, lease.StrategyPriority); err != nil && !errors.Is(err, lease.ErrPermission) {
				errs = append(errs, err)
				continue
			}
			set = append(set, k)
		}
		unset = set
	}
	for _, k := range unset {
		s, _ := parseShard(r.cfg.Controller, k, r.cfg.Shards)
		r.strategy[s] = true
	}
	var gone []string
	for s := range r.cands {
		if _, ok := want[s]; !ok {
			gone = append(gone, Key(r.cfg.Controller, s))
		}
	}
	if err := r.c.WithdrawMany(ctx, gone, r.owner); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for s := range r.cands {
		if _, ok := want[s]; !ok {
			delete(r.cands, s)
		}
	}
	keys := make([]string, 0, len(want))
	prios := make([]int32, 0, len(want))
	for s, p := range want {
		keys = append(keys, Key(r.cfg.Controller, s))
		prios = append(prios, p)
	}
	if _, err := r.c.RegisterMany(ctx, keys, prios, lease.Candidate{Owner: r.owner, Ready: true, TTL: r.cfg.TTL}); err != nil {
		return errors.Join(append(errs, err)...)
	}
	r.cands = want
	r.candsAt = r.c.Clock().Now()
	return errors.Join(errs...)
}

// ensureMember acquires the member key. When another process holds it, it
// returns when to look again: at the holder's expiry (a crashed process of
// this identity, such as this replica before a restart) or after a renewal
// period; a holder seen to renew is alive, and ensureMember returns
// ErrIdentityTaken.
func (r *Sharder) ensureMember(ctx context.Context) (time.Duration, error) {
	r.mu.Lock()
	m := r.member
	r.mu.Unlock()
	key := MemberKey(r.cfg.Controller, r.cfg.Identity)
	if m != nil {
		_ = m.Release(ctx) // an ended term may still hold the key
	}
	g, ok, err := r.c.Acquire(ctx, key, r.owner, r.cfg.TTL)
	if err != nil {
		return r.cfg.Poll, err
	}
	if !ok {
		st, err := r.c.Inspect(ctx, key)
		if err != nil {
			return r.cfg.Poll, err
		}
		if !st.Held {
			return r.cfg.Poll, fmt.Errorf("%s: released meanwhile", key)
		}
		if r.rival.Held && st.Owner == r.rival.Owner && st.ExpiresAt.After(r.rival.ExpiresAt) {
			return 0, fmt.Errorf("%w: %s is held by %s, which renewed it", ErrIdentityTaken, key, st.Owner)
		}
		r.rival = st
		wait := min(r.cfg.RenewEvery+r.cfg.Poll, max(st.ExpiresLocal().Sub(r.c.Clock().Now()), time.Millisecond))
		return wait, fmt.Errorf("%s is held by %s: waiting for its renewal or its expiry", key, st.Owner)
	}
	t, err := r.c.Begin(g, r.cfg.Margin, nil)
	if err != nil {
		return r.cfg.Poll, err
	}
	r.mu.Lock()
	r.member = t
	r.mu.Unlock()
	r.rival = lease.State{}
	return 0, nil
}

// announce wakes the other replicas watching the controller's changed key:
// an acquire and a release of it, each notified.
func (r *Sharder) announce(ctx context.Context) {
	g, ok, err := r.c.Acquire(ctx, changedKey(r.cfg.Controller), r.owner, time.Second)
	if err == nil && ok {
		_ = r.c.Release(ctx, g.Token)
	}
}

// take acquires the shards (wait 0) in one statement, or takes the grants
// a handover gave this replica (an acquire answers the caller's own
// grant), and begins their terms. A shard another owner took meanwhile is
// left to the next round.
func (r *Sharder) take(ctx context.Context, shards []int) error {
	var errs []error
	for len(shards) > 0 {
		n := min(len(shards), lease.MaxRenewMany)
		keys := make([]string, n)
		for i, s := range shards[:n] {
			keys[i] = Key(r.cfg.Controller, s)
		}
		res, err := r.c.AcquireMany(ctx, keys, r.owner, r.cfg.TTL)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for i, s := range shards[:n] {
			if res[i].Err != nil || !res[i].OK {
				if res[i].Err != nil {
					errs = append(errs, res[i].Err)
				}
				continue
			}
			t, err := r.c.Begin(res[i].Grant, r.cfg.Margin, nil)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			r.mu.Lock()
			r.owned[s] = &owned{s: s, term: t}
			delete(r.handed, s)
			r.mu.Unlock()
			r.metrics.rebalances.WithLabelValues("acquired").Inc()
			if r.cfg.OnAcquired != nil {
				r.cfg.OnAcquired(s)
			}
		}
		shards = shards[n:]
	}
	return errors.Join(errs...)
}

// endLocked ends o's term: its contexts are cancelled with cause.
func (r *Sharder) endLocked(o *owned, cause error) {
	o.stopping = true
	o.term.End(cause)
	kind := "released"
	if !errors.Is(cause, ErrRebalanced) {
		kind = "lost"
	}
	r.metrics.rebalances.WithLabelValues(kind).Inc()
}

// releaseAfterWork waits, in the background, for the work begun under the
// ended terms of os, then releases them all in one statement
// (lease.Client.ReleaseMany) and forgets them. A release hands its key to
// a registered candidate, if any, in the same transaction: the former
// owner's work has ended before the grant moves.
func (r *Sharder) releaseAfterWork(os []*owned) {
	if len(os) == 0 {
		return
	}
	r.stops.Add(1)
	go func() {
		defer r.stops.Done()
		ts := make([]lease.Token, len(os))
		for i, o := range os {
			o.inflight.Wait()
			ts[i] = o.term.Grant().Token
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
		defer cancel()
		for len(ts) > 0 {
			n := min(len(ts), lease.MaxRenewMany)
			errs, err := r.c.ReleaseMany(ctx, ts[:n])
			if err != nil {
				r.cfg.Logger.Warn("shard: release", "controller", r.cfg.Controller, "shards", n, "err", err)
			}
			for i, err := range errs {
				if err != nil && !errors.Is(err, lease.ErrLost) {
					r.cfg.Logger.Warn("shard: release", "key", ts[i].Key, "err", err)
				}
			}
			ts = ts[n:]
		}
		r.mu.Lock()
		for _, o := range os {
			if r.owned[o.s] == o {
				delete(r.owned, o.s)
			}
		}
		r.metrics.owned.Set(float64(len(r.owned)))
		r.mu.Unlock()
		r.wake()
	}()
}

// leave ends every shard's term (cancelling its work), waits for that
// work, then releases the member key and every shard in one statement: the
// others see this replica gone and its shards at their runner-ups (a
// handover where one registered) in one commit. Then it announces the
// change and withdraws its candidacies.
func (r *Sharder) leave() {
	r.mu.Lock()
	var ending []*owned
	for _, o := range r.owned {
		if !o.stopping {
			r.endLocked(o, ErrRebalanced)
			ending = append(ending, o)
		}
	}
	m := r.member
	var ts []lease.Token
	for s, t := range r.handed {
		if r.owned[s] == nil {
			ts = append(ts, t) // handed over to this process, never taken
		}
	}
	r.handed = map[int]lease.Token{}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
	defer cancel()
	start := time.Now()
	if m != nil {
		m.End(lease.ErrReleased)
		ts = append(ts, m.Grant().Token)
	}
	for _, o := range ending {
		o.inflight.Wait()
		ts = append(ts, o.term.Grant().Token)
	}
	worked := time.Since(start)
	for len(ts) > 0 {
		n := min(len(ts), lease.MaxRenewMany)
		if _, err := r.c.ReleaseMany(ctx, ts[:n]); err != nil {
			r.cfg.Logger.Warn("shard: release", "controller", r.cfg.Controller, "keys", n, "err", err)
		}
		ts = ts[n:]
	}
	released := time.Since(start)
	r.mu.Lock()
	for _, o := range ending {
		if r.owned[o.s] == o {
			delete(r.owned, o.s)
		}
	}
	r.mu.Unlock()
	if m != nil {
		r.announce(ctx)
	}
	r.stops.Wait() // releases begun by earlier rounds
	r.cfg.Logger.Info("shard: left", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
		"shards", len(ending), "work_ended", worked, "released", released)
	var keys []string
	for s := range r.cands {
		keys = append(keys, Key(r.cfg.Controller, s))
	}
	_ = r.c.WithdrawMany(ctx, keys, r.owner)
	r.cands = map[int]int32{}
	// A handover may have granted this process a shard it never took (it
	// stopped meanwhile, or was refused): release those too.
	if states, err := r.c.List(ctx); err == nil {
		var stray []lease.Token
		for _, st := range states {
			if _, ok := parseShard(r.cfg.Controller, st.Key, r.cfg.Shards); ok && st.Held && st.Owner == r.owner {
				stray = append(stray, lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch})
			}
		}
		_, _ = r.c.ReleaseMany(ctx, stray)
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
