// Package shard spreads one controller's objects over every replica: N
// shards fixed per controller, each a pg_lease key with its own epoch,
// balanced over the live members (counts differ by at most one) and held
// by one replica at a time.
//
// Membership and assignment come from the database alone. Each replica
// holds a member key (<controller>/member/<identity>) and renews it with
// all its shard keys in one statement (lease.renew_many). A replica reads
// the live members and the shards' holders from lease.list and computes
// the owner of every shard with Balance: each member keeps the shards it
// holds up to its cap (n/members, one more for some), the rest go by
// rendezvous weight to the members with room. Every replica computes the
// same answer from the same list, a change of members moves only the
// shards that must move (the fewest any balanced map could), and the
// answer stays the same while those moves run. A round is a pure plan over
// (members, holders, the shards this replica tracks, now), decide, applied
// by a few statements.
//
// Rebalancing has no overlap and no orphan:
//   - a replica that should no longer own shard s first cancels the
//     shard's context and waits for the work running under it, then
//     releases the key;
//   - the release hands the key over in its own transaction (a
//     lease.candidate registration under the priority strategy): a joining
//     replica registers for the shards it will win before it announces
//     itself, and every replica registers for the shards it would get if
//     the member they are assigned to left (Balance without that member,
//     from the assignment, so that the registrations do not change twice
//     while a join's shards move), so a move leaves no shard free; without
//     a registration the key is freed and the new owner acquires it;
//   - the recipient of a handover takes the grant as its notification
//     arrives (with a Waiter), in one statement with no read before it (a
//     renewal of the grant the notification names: a forged one takes
//     nothing), without waiting for a round to list the keys; handovers
//     notified while that statement runs are taken beside it (one more
//     statement, sent before the first returns), those notified later next,
//     as long as each batch takes a grant (a flood of forged ones never
//     holds the rounds back), and all its keys are renewed at once after the
//     last; a round that listed before such a take lists again before it
//     plans (the older list shows the shard held by the releaser);
//   - a replica that stops releases its member key and every shard in one
//     statement (lease.Client.ReleaseMany) once their work ended (a shard whose
//     work outlasts a Poll goes in a later statement), at once: not after the
//     statements its round, renewal or take run at the stop (a grant one of
//     them takes after that begins no work and is released before Run
//     returns);
//   - a crashed replica's keys lapse at their server expiry, one instant:
//     a replica renews them in one statement, and after each take of new
//     shards renews all of them at once. Every other replica plans at each
//     round which of a member's shards come to it were that member to stop
//     renewing (Balance without it), and takes them in one statement
//     (lease.Client.AcquireManyAt) with no read before it, sent a Poll
//     before the earliest local bound of that expiry (less when the TTL
//     leaves less room: a member renewing on time is listed again before
//     its takeover is due) and waiting on the server until its clock shows
//     it: one statement per surviving replica, sent beside the rounds (a
//     round's statement running then does not delay it),
//     with no round trip after the lapse. The server decides the expiry by
//     its own clock: a shard still held then (its holder renewed) is
//     refused and left to the next round. A replica that crashed between
//     a take and that renewal holds keys that lapse apart: each other
//     replica then takes its share at the last of those lapses, the
//     shards lapsed before with them (also those free and assigned to the
//     crashed replica, not taken yet), still in one statement.
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
	"sort"
	"sync"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// MaxShards is the most shards of one controller. A replica renews its
// member key and its shards in one lease.renew_many call while it holds
// fewer than lease.MaxBatch keys, else in calls of lease.MaxBatch keys.
const MaxShards = 4096

// ErrInvalidConfig matches every error of New for a bad Config.
var ErrInvalidConfig = errors.New("shard: invalid config")

// ErrRebalanced is the cause of a shard context cancelled because the shard
// moved to another replica, or because this replica stops.
var ErrRebalanced = errors.New("shard: shard moved to another replica")

// Config configures a Sharder. Client, Controller and Shards are required.
type Config struct {
	// Client's pool should have a connection free beside a round's, a
	// renewal's and a take's: a leave's release does not wait for those.
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
	// RenewEvery is the period of the batch renewal. Default
	// lease.RenewInterval(TTL).
	RenewEvery time.Duration
	// Margin of each term (lease.CheckMargin). Zero: the default.
	Margin time.Duration
	// Poll is how often a replica retries a shard that it should own but
	// another replica still holds (it is being released). Default 50 ms.
	Poll time.Duration
	// Waiter, when set, wakes the replica at once when a shard key is
	// released and when a replica joins or leaves. Without it the replica
	// sees such changes at its next Poll or RenewEvery.
	Waiter *listen.Waiter
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
		c.RenewEvery = lease.RenewInterval(c.TTL)
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
	keep    *lease.KeepAliveSet // the member key and every live shard key

	// moves orders a round's plan and the acquires and releases that apply
	// it with the takes of handed-over grants (takeHandedOver): a plan
	// never releases as stray a grant that is being taken.
	moves sync.Mutex

	mu       sync.Mutex
	member   *lease.Term
	owned    map[int]*owned
	members  []string
	assign   []string
	lastList time.Time
	unowned  map[int]bool        // shards nobody held at the last list
	handed   map[int]lease.Token // grants a handover gave this process, not taken yet
	leaving  bool                // the leave began: no term begins
	stops    sync.WaitGroup
	pending  []takeover    // the last plan's takeovers not taken yet
	replan   chan struct{} // a round set pending: sendTakeovers looks again
	overs    int           // takeovers sent, handovers taken: a round listed before one re-lists

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
	inflight int           // work begun under the term (Begin) and not done; under mu
	drained  chan struct{} // closed once stopping and no work runs
	stopping bool
}

func newOwned(s int, t *lease.Term) *owned {
	return &owned{s: s, term: t, drained: make(chan struct{})}
}

// doneLocked ends one piece of o's work.
func (o *owned) doneLocked() {
	o.inflight--
	if o.stopping && o.inflight == 0 {
		close(o.drained)
	}
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
	r := &Sharder{cfg: cfg, c: cfg.Client, owner: owner, kick: make(chan struct{}, 1), replan: make(chan struct{}, 1),
		owned: map[int]*owned{}, unowned: map[int]bool{}, handed: map[int]lease.Token{},
		cands: map[int]int32{}, strategy: map[int]bool{},
		metrics: newReplicaMetrics(cfg.Controller, cfg.Identity)}
	r.keep = cfg.Client.NewKeepAliveSet(lease.KeepAliveOptions{Interval: cfg.RenewEvery, Observe: r.renewed})
	return r, nil
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
	o.inflight++
	ctx, cancel := o.term.Context(parent)
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			cancel()
			r.mu.Lock()
			o.doneLocked()
			r.mu.Unlock()
		})
	}, true
}

// Assignment is the last view of the members (sorted) and of the owner
// each shard should have (Assign over them).
func (r *Sharder) Assignment() (members []string, owners []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.members...), append([]string(nil), r.assign...)
}
