package shard_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/utils/clock"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/shard"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// cluster is a set of replicas of one controller on one database, with a
// worker per replica that acts under every shard it owns and an overlap
// detector shared by all workers.
type cluster struct {
	t        *testing.T
	dsn      string
	pool     *pgxpool.Pool
	n        int
	ttl      time.Duration
	renew    time.Duration // every replica's RenewEvery (0: the default)
	mu       sync.Mutex
	active   map[int]string // shard -> replica acting under it now
	overlaps []string
	last     []string            // the owners at the last settled state
	poolOpts []pgtest.PoolOption // of every replica's pool
	replicas map[string]*replica
	acquired func(id string, s int) // when set, each replica's OnAcquired
}

type replica struct {
	r      *shard.Sharder
	w      *listen.Waiter
	cancel context.CancelCauseFunc
	done   chan struct{}
}

func newCluster(t *testing.T, n int, ttl time.Duration) *cluster {
	dsn := pgtest.NewLeaseDatabase(t)
	return &cluster{t: t, dsn: dsn, pool: pgtest.NewPool(t, dsn), n: n, ttl: ttl,
		active: map[int]string{}, replicas: map[string]*replica{}}
}

// start runs a replica named id with its own pool and waiter, and a worker
// that keeps acting under each owned shard: it marks the shard active
// (failing on another replica's mark), works 2 ms, and unmarks it.
// startTraced is start with tr tracing the replica's lease pool (a gate
// that holds statements back, a recorder).
func (c *cluster) startTraced(id string, tr pgx.QueryTracer) *replica {
	c.poolOpts = []pgtest.PoolOption{func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr }}
	defer func() { c.poolOpts = nil }()
	return c.start(id)
}

func (c *cluster) start(id string) *replica {
	t := c.t
	pool := pgtest.NewPool(t, c.dsn, c.poolOpts...)
	cfg, err := pgx.ParseConfig(c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	w, err := listen.NewWaiter(pgtest.Context(t, 0), cfg, listen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	var onAcquired func(int)
	if f := c.acquired; f != nil {
		onAcquired = func(s int) { f(id, s) }
	}
	r, err := shard.New(shard.Config{Client: lease.New(pool), Controller: "ctl", Shards: c.n,
		Identity: id, TTL: c.ttl, RenewEvery: c.renew, Waiter: w, OnAcquired: onAcquired})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), runOf{}, id))
	rep := &replica{r: r, w: w, cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := r.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", id, err)
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for s := range c.n {
				c.work(ctx, r, id, s)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go func() { wg.Wait(); close(rep.done) }()
	t.Cleanup(func() { cancel(context.Canceled); <-rep.done })
	c.mu.Lock()
	c.replicas[id] = rep
	c.mu.Unlock()
	return rep
}

func (c *cluster) work(ctx context.Context, r *shard.Sharder, id string, s int) {
	sctx, done, ok := r.Begin(ctx, s)
	if !ok {
		return
	}
	defer done()
	tok, _ := lease.TokenFromContext(sctx)
	if tok.Key != shard.Key("ctl", s) || tok.Owner != r.Owner() {
		c.t.Errorf("%s: shard %d's context carries %v", id, s, tok)
	}
	c.mu.Lock()
	if other, busy := c.active[s]; busy {
		c.overlaps = append(c.overlaps, fmt.Sprintf("shard %d: %s began while %s acted under it", s, id, other))
	}
	c.active[s] = id
	c.mu.Unlock()
	select {
	case <-sctx.Done():
	case <-time.After(2 * time.Millisecond):
	}
	c.mu.Lock()
	if c.active[s] == id {
		delete(c.active, s)
	}
	c.mu.Unlock()
}

// waitSettled waits until the live replicas own every shard between them
// as Balance would leave it (its fixed point: balanced, nothing to move),
// and returns how long that took. It logs how many shards moved since the
// last settled state against the fewest that had to: the replicas hand a
// leaver's shards to the runner-ups they registered last, which a leave
// right after another change may name from the holders before it.
func (c *cluster) waitSettled(live ...string) time.Duration {
	c.t.Helper()
	start := time.Now()
	deadline := time.Now().Add(2*time.Minute + 10*c.ttl)
	for {
		got := make([]string, c.n)
		dup := false
		c.mu.Lock()
		for _, id := range live {
			for _, s := range c.replicas[id].r.Owned() {
				dup = dup || got[s] != ""
				got[s] = id
			}
		}
		c.mu.Unlock()
		want := shard.Balance(c.n, live, got)
		if !dup && !slices.Contains(got, "") && slices.Equal(got, want) {
			if c.last != nil {
				c.t.Logf("settled on %v: %d shards moved, the minimum %d", live, moved(c.last, got), minMoves(c.n, live, c.last))
			}
			c.last = got
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("not settled on %v: owners %v, want %v", live, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *cluster) checkNoOverlap() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.overlaps {
		c.t.Error(o)
	}
}

// TestJoinLeaveCrash: replicas join one by one, one leaves, one crashes;
// after each change the live replicas own every shard as Assign says (no
// orphan), and no two replicas ever act under one shard at once (no
// overlap), also when a crashed replica's work runs until its terms'
// local deadlines.
func TestJoinLeaveCrash(t *testing.T) {
	c := newCluster(t, 16, 3*time.Second)
	c.start("a")
	t.Logf("a alone: settled in %v", c.waitSettled("a"))
	c.start("b")
	t.Logf("b joins: settled in %v", c.waitSettled("a", "b"))
	c.start("c")
	t.Logf("c joins: settled in %v", c.waitSettled("a", "b", "c"))
	c.checkNoOverlap()

	b := c.replicas["b"]
	b.cancel(context.Canceled)
	<-b.done
	if owned := b.r.Owned(); len(owned) != 0 {
		t.Errorf("b still owns %v after leaving", owned)
	}
	t.Logf("b leaves: settled in %v", c.waitSettled("a", "c"))

	cr := c.replicas["c"]
	cr.cancel(shard.ErrCrash) // stops renewing; its work stops at its terms' deadlines
	t.Logf("c crashes: settled in %v (ttl %v)", c.waitSettled("a"), c.ttl)
	<-cr.done
	c.checkNoOverlap()

	// Every shard key is held by a; the epochs moved on every handover.
	states, err := lease.New(c.pool).List(pgtest.Context(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, st := range states {
		for s := range c.n {
			if st.Key == shard.Key("ctl", s) {
				if !st.Held || st.Owner != c.replicas["a"].r.Owner() {
					t.Errorf("%s: held %v by %q, want a", st.Key, st.Held, st.Owner)
				}
				held++
			}
		}
	}
	if held != c.n {
		t.Errorf("%d shard keys, want %d", held, c.n)
	}
}

// TestFormerOwnerRejectedPerShard: a replica that stopped renewing (as a
// crashed or paused one) keeps its shard's token; after another replica
// took the shard over and wrote through a guard, the former owner's write
// with its token is rejected, by fence.PGGuard and by fence.InTx.
func TestFormerOwnerRejectedPerShard(t *testing.T) {
	c := newCluster(t, 4, 3*time.Second)
	ctx := pgtest.Context(t, 0)
	a := c.start("a")
	c.waitSettled("a")
	sctx, done, ok := a.r.Begin(ctx, 2)
	if !ok {
		t.Fatal("a does not own shard 2")
	}
	old, _ := lease.TokenFromContext(sctx)
	done()
	guard, err := fence.NewPGGuard(c.pool, fence.PGGuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	if err := guard.Write(ctx, old, nil); err != nil {
		t.Fatalf("a's write under its own shard: %v", err)
	}

	a.cancel(shard.ErrCrash)
	<-a.done
	<-sctx.Done() // the term's local deadline ended a's context
	b := c.start("b")
	c.waitSettled("b")
	bctx, bdone, ok := b.r.Begin(ctx, 2)
	if !ok {
		t.Fatal("b does not own shard 2")
	}
	defer bdone()
	cur, _ := lease.TokenFromContext(bctx)
	if cur.Key != old.Key || cur.Epoch <= old.Epoch {
		t.Fatalf("b's token %v after a's %v", cur, old)
	}
	if err := guard.Write(bctx, cur, nil); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	if err := guard.Write(ctx, old, nil); !errors.Is(err, fence.ErrStale) {
		t.Errorf("a's write after b's: %v, want ErrStale", err)
	}
	err = fence.InTx(ctx, c.pool, old, func(pgx.Tx) error { return nil })
	if !errors.Is(err, fence.ErrStale) || !errors.Is(err, lease.ErrLost) {
		t.Errorf("a's fenced transaction: %v, want ErrStale and ErrLost", err)
	}
	// Another shard's token of b is not affected by shard 2's epochs.
	if err := fence.InTx(ctx, c.pool, cur, func(pgx.Tx) error { return nil }); err != nil {
		t.Errorf("b's fenced transaction: %v", err)
	}
}

// TestLeaveHandsOver: a leaving replica's shards move to their runner-ups
// by handover, each in the release's transaction, so no shard is ever
// free; the work under each ended before its grant moved (no overlap).
func TestLeaveHandsOver(t *testing.T) {
	leaveHandsOver(t, newCluster(t, 16, 3*time.Second))
}

// TestLeaveHandsOverBesideAnotherRole: the replicas run as a database role
// of their own, and another role set the priority strategy on every shard
// key before them and registers a candidate of its own at the highest
// priority on each: a leaving replica's shards still go to their
// runner-ups, and nothing of the other role changes that.
func TestLeaveHandsOverBesideAnotherRole(t *testing.T) {
	c := newCluster(t, 16, 3*time.Second)
	ctx := pgtest.Context(t, 0)
	_, appDSN := pgtest.NewRole(t, c.dsn, "regress_pglease_app")
	_, eveDSN := pgtest.NewRole(t, c.dsn, "regress_pglease_eve")
	eve := lease.New(pgtest.NewPool(t, eveDSN))
	keys := make([]string, c.n)
	prios := make([]int32, c.n)
	for s := range c.n {
		keys[s], prios[s] = shard.Key("ctl", s), 1<<31-1
	}
	if err := handover.SetStrategyMany(ctx, eve, keys, handover.StrategyPriority); err != nil {
		t.Fatal(err)
	}
	if _, err := handover.RegisterMany(ctx, eve, keys, prios, handover.Candidate{Owner: "eve", Ready: true, TTL: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	c.dsn, c.pool = appDSN, pgtest.NewPool(t, appDSN)
	leaveHandsOver(t, c)
}

func leaveHandsOver(t *testing.T, c *cluster) {
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	c.waitSettled("a", "b", "c")
	owners := c.last
	after := shard.Balance(c.n, []string{"a", "c"}, owners)
	c.waitRunnersUp(owners, after, "b")
	b := c.replicas["b"]
	bOwner := b.r.Owner()
	b.cancel(context.Canceled)
	<-b.done
	t.Logf("b leaves: settled in %v", c.waitSettled("a", "c"))
	c.checkNoOverlap()
	if !slices.Equal(c.last, after) {
		t.Errorf("b's shards went to %v, want %v (only b's shards move)", c.last, after)
	}
	for s := range c.n {
		if owners[s] != "b" {
			continue
		}
		h, err := leaseadmin.History(ctx, lc, shard.Key("ctl", s), 1)
		if err != nil {
			t.Fatal(err)
		}
		want := c.replicas[after[s]].r.Owner()
		if len(h) != 1 || h[0].Kind != "handed_over" || h[0].PreviousOwner != bOwner || h[0].Owner != want {
			t.Errorf("shard %d: last history %+v, want handed_over from %s to %s", s, h, bOwner, want)
		}
	}
}

// waitRunnersUp waits until, for each shard leaver holds in owners, the
// replica after names is the first candidate of a release (the server's
// answer).
func (c *cluster) waitRunnersUp(owners, after []string, leaver string) {
	t := c.t
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	for s := range c.n {
		if owners[s] != leaver {
			continue
		}
		want := c.replicas[after[s]].r.Owner()
		waitFor(t, fmt.Sprintf("%s registered as the candidate of shard %d", want, s), func() bool {
			_, cands, err := handover.Candidates(ctx, lc, shard.Key("ctl", s))
			if err != nil {
				t.Fatal(err)
			}
			for _, cs := range cands {
				if cs.Owner == want && cs.Rank == 1 {
					return true
				}
			}
			return false
		})
	}
}

// runOf marks the context of a replica's Run (its value: the replica's
// id), and every statement context derived from it.
type runOf struct{}

// listGate holds back a replica's lease.list statements while closed:
// every one, or with outsideRun those whose context does not come from
// Run's (a stopping replica's own, after the loop ended), or with allKeys
// only the lists of every key (a round's), not a read of named keys.
type listGate struct {
	outsideRun bool
	allKeys    bool
	mu         sync.Mutex
	closed     chan struct{} // nil while open
	held       int           // statements held back
}

func (g *listGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *listGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

func (g *listGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	pattern := "lease.list("
	if g.allKeys {
		pattern = "lease.list()"
	}
	if strings.Contains(d.SQL, pattern) && (!g.outsideRun || ctx.Value(runOf{}) == nil) {
		g.mu.Lock()
		closed := g.closed
		if closed != nil {
			g.held++
		}
		g.mu.Unlock()
		if closed != nil {
			<-closed // whatever ctx says: a statement that gives up is no statement held back
		}
	}
	return ctx
}

func (g *listGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestHandoverTakenOnItsNotification: the replicas a leaving replica hands
// its shards to take them as the handovers' notifications arrive, in one
// statement (a renewal of the grants the notifications name), with no read
// before it: with every list of theirs held back, they own and act under
// those shards.
func TestHandoverTakenOnItsNotification(t *testing.T) {
	c := newCluster(t, 16, 3*time.Second)
	gate := &listGate{}
	defer gate.open()
	c.poolOpts = []pgtest.PoolOption{func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = gate }}
	c.start("a")
	c.start("c")
	c.poolOpts = nil
	c.start("b")
	c.waitSettled("a", "b", "c")
	owners := c.last
	after := shard.Balance(c.n, []string{"a", "c"}, owners)
	c.waitRunnersUp(owners, after, "b")

	gate.close()
	b := c.replicas["b"]
	b.cancel(context.Canceled)
	<-b.done
	for s := range c.n {
		if owners[s] != "b" {
			continue
		}
		r := c.replicas[after[s]].r
		waitFor(t, fmt.Sprintf("%s acting under shard %d with its lists held back", after[s], s), func() bool { return r.Owns(s) })
	}
	gate.open()
	c.waitSettled("a", "c")
	c.checkNoOverlap()
	if !slices.Equal(c.last, after) {
		t.Errorf("b's shards went to %v, want %v", c.last, after)
	}
}

// heldListGate holds back, once armed, the end of a replica's next round
// list (lease.list() of every key from Run's context): the round has read
// the keys and waits to plan from them. It counts the round lists begun.
type heldListGate struct {
	mu     sync.Mutex
	armed  bool
	held   chan struct{} // closed once a list is held
	resume chan struct{} // closed to let it go
	lists  int
}

type roundList struct{}

func newHeldListGate() *heldListGate {
	return &heldListGate{held: make(chan struct{}), resume: make(chan struct{})}
}

func (g *heldListGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "lease.list()") || ctx.Value(runOf{}) == nil {
		return ctx
	}
	g.mu.Lock()
	g.lists++
	g.mu.Unlock()
	return context.WithValue(ctx, roundList{}, true)
}

func (g *heldListGate) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(roundList{}) == nil {
		return
	}
	g.mu.Lock()
	hold := g.armed
	g.armed = false
	g.mu.Unlock()
	if hold {
		close(g.held)
		<-g.resume
	}
}

func (g *heldListGate) listsBegun() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lists
}

// holdShardsOfY takes, as owner y#0, the shards of n that members assign
// to y, and returns them with their tokens after y's member token.
func holdShardsOfY(t *testing.T, ctx context.Context, lc *lease.Client, n int, members []string, member lease.Token) ([]int, []lease.Token) {
	t.Helper()
	var ys []int
	var keys []string
	for s, m := range shard.Assign(n, members) {
		if m == "y" {
			ys, keys = append(ys, s), append(keys, shard.Key("ctl", s))
		}
	}
	grants, denied, err := lc.AcquireMany(ctx, keys, "y#0", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tokens := []lease.Token{member}
	for i, s := range ys {
		if denied[i] != nil || grants[i].Epoch == 0 {
			t.Fatalf("y's shard %d not acquired: %v", s, denied[i])
		}
		tokens = append(tokens, grants[i].Token)
	}
	return ys, tokens
}

// TestHandoverTakenAfterARoundListedIsKept: a round that listed before a
// handover's notification was taken lists again before it plans: a plan
// from the older list would give up the shard just taken (that list shows
// it held by the member that handed it over). Member y runs no replica:
// the test holds its keys (owner y#0) and releases them all at once, as a
// leave, while a's round holds the list it read before; a keeps each of
// y's shards under the grant the handover gave it, with no release.
func TestHandoverTakenAfterARoundListedIsKept(t *testing.T) {
	c := newCluster(t, 4, 3*time.Second)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	member, ok, err := lc.Acquire(ctx, shard.MemberKey("ctl", "y"), "y#0", 10*time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ys, tokens := holdShardsOfY(t, ctx, lc, c.n, []string{"a", "y"}, member.Token)
	gate := newHeldListGate()
	c.startTraced("a", gate)
	var resumed sync.Once
	resume := func() { resumed.Do(func() { close(gate.resume) }) }
	t.Cleanup(resume) // before the replica stops
	a := c.replicas["a"].r
	owners := make([]string, c.n)
	waitFor(t, "a owning every shard but y's", func() bool {
		for s := range c.n {
			owners[s] = "a"
			if slices.Contains(ys, s) {
				owners[s] = "y"
			}
			if a.Owns(s) != (owners[s] == "a") {
				return false
			}
		}
		return true
	})
	c.waitRunnersUp(owners, shard.Assign(c.n, []string{"a"}), "y")

	gate.mu.Lock()
	gate.armed = true
	gate.mu.Unlock()
	<-gate.held
	// y leaves: one release of its member key and shards hands the shards
	// to a, whose round holds a list that shows y live and holding them.
	if _, err := lc.ReleaseMany(ctx, tokens); err != nil {
		t.Fatal(err)
	}
	epochs := map[int]int64{}
	for _, s := range ys {
		waitFor(t, fmt.Sprintf("a acting under y's shard %d", s), func() bool { return a.Owns(s) })
		sctx, done, ok := a.Begin(ctx, s)
		if !ok {
			t.Fatalf("a does not own shard %d", s)
		}
		tok, _ := lease.TokenFromContext(sctx)
		done()
		epochs[s] = tok.Epoch
	}
	lists := gate.listsBegun()
	resume()
	// Two more lists: a round planned from a list that shows the handover.
	waitFor(t, "two more rounds of a", func() bool { return gate.listsBegun() >= lists+2 })
	for _, s := range ys {
		sctx, done, ok := a.Begin(ctx, s)
		if !ok {
			t.Errorf("a gave up shard %d, handed to it after its round listed", s)
			continue
		}
		tok, _ := lease.TokenFromContext(sctx)
		done()
		if tok.Epoch != epochs[s] {
			t.Errorf("shard %d: a acts under epoch %d, want the handover's %d", s, tok.Epoch, epochs[s])
		}
		h, err := leaseadmin.History(ctx, lc, shard.Key("ctl", s), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 1 || h[0].Kind != "handed_over" || h[0].PreviousOwner != "y#0" || h[0].Owner != a.Owner() {
			t.Errorf("shard %d: last history %+v, want handed_over from y#0 to %s", s, h, a.Owner())
		}
	}
	c.checkNoOverlap()
}

// TestLeaveReleasesFirst: a leaving replica's first statement is the
// release that hands its shards over; the list that finds grants handed to
// it unseen runs beside it: with the leaver's lists held back, the others
// own and act under its shards.
func TestLeaveReleasesFirst(t *testing.T) {
	c := newCluster(t, 16, 3*time.Second)
	gate := &listGate{outsideRun: true}
	defer gate.open()
	c.start("a")
	c.start("c")
	c.startTraced("b", gate)
	c.waitSettled("a", "b", "c")
	owners := c.last
	after := shard.Balance(c.n, []string{"a", "c"}, owners)
	c.waitRunnersUp(owners, after, "b")

	gate.close()
	b := c.replicas["b"]
	bOwner := b.r.Owner()
	b.cancel(context.Canceled)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	for s := range c.n {
		if owners[s] != "b" {
			continue
		}
		r := c.replicas[after[s]].r
		waitFor(t, fmt.Sprintf("%s acting under shard %d with the leaver's lists held back", after[s], s), func() bool { return r.Owns(s) })
		// Handed over by the leave's release, not taken when b's grant lapsed.
		h, err := leaseadmin.History(ctx, lc, shard.Key("ctl", s), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 1 || h[0].Kind != "handed_over" || h[0].PreviousOwner != bOwner || h[0].Owner != r.Owner() {
			t.Errorf("shard %d: last history %+v, want handed_over from %s to %s", s, h, bOwner, r.Owner())
		}
	}
	gate.open()
	<-b.done
	gate.mu.Lock()
	held := gate.held
	gate.mu.Unlock()
	if held == 0 {
		t.Error("the leaver listed nothing: the gate tested nothing")
	}
	c.waitSettled("a", "c")
	c.checkNoOverlap()
}

// TestDuplicateIdentity: a second process given the identity of a live
// replica refuses to run (ErrIdentityTaken) and never owns a shard, nor
// disturbs the first; a replica restarted after a crash under the same
// identity is not refused: it takes over when the crashed process's keys
// lapse.
func TestDuplicateIdentity(t *testing.T) {
	c := newCluster(t, 8, 2*time.Second)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	a := c.start("a")
	c.waitSettled("a")
	before, err := shard.Read(ctx, lc, "ctl", c.n)
	if err != nil {
		t.Fatal(err)
	}

	dup, err := shard.New(shard.Config{Client: lease.New(pgtest.NewPool(t, c.dsn)), Controller: "ctl",
		Shards: c.n, Identity: "a", TTL: c.ttl})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dup.Run(ctx) }()
	var runErr error
	for waiting := true; waiting; {
		select {
		case runErr = <-done:
			waiting = false
		case <-time.After(time.Millisecond):
		}
		if owned := dup.Owned(); len(owned) != 0 {
			t.Fatalf("the duplicate owns %v", owned)
		}
	}
	if !errors.Is(runErr, shard.ErrIdentityTaken) {
		t.Fatalf("the duplicate's Run: %v, want ErrIdentityTaken", runErr)
	}
	after, err := shard.Read(ctx, lc, "ctl", c.n)
	if err != nil {
		t.Fatal(err)
	}
	for s, st := range after.Shards {
		if st.State.Owner != a.r.Owner() || st.State.Epoch != before.Shards[s].State.Epoch {
			t.Errorf("shard %d: %s@%d after the duplicate, %s@%d before", s, st.State.Owner, st.State.Epoch,
				before.Shards[s].State.Owner, before.Shards[s].State.Epoch)
		}
	}
	c.checkNoOverlap()

	// A crash, then a restart under the same identity: a new process.
	a.cancel(shard.ErrCrash)
	<-a.done
	again := c.start("a")
	c.waitSettled("a")
	if again.r.Owner() == a.r.Owner() {
		t.Errorf("the restarted replica's owner %s is the crashed one's", again.r.Owner())
	}
	c.checkNoOverlap()
}

// waitFor polls cond every 5 ms for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within a minute", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replicaLessMember holds member id's key (owner id#0) for ten minutes,
// with no replica running under it, and returns the assignment Balance
// makes over id and a member v, and id's shards in it.
func (c *cluster) replicaLessMember(ctx context.Context, lc *lease.Client, id string) (assign []string, mine []int) {
	c.t.Helper()
	if _, ok, err := lc.Acquire(ctx, shard.MemberKey("ctl", id), id+"#0", 10*time.Minute); err != nil || !ok {
		c.t.Fatal(ok, err)
	}
	assign = shard.Balance(c.n, []string{id, "v"}, nil)
	for s, m := range assign {
		if m == id {
			mine = append(mine, s)
		}
	}
	return assign, mine
}

// TestForgedHandoverTakesNothing: any role may NOTIFY pg_lease. A forged
// handover naming a replica's owner and a free shard the assignment gives
// to another member must not make that replica take the shard: a
// notification is only a sign, and the grant a real handover gave is
// already the recipient's. Member b is live (its member key held) but runs
// no replica, so its shards stay free; the barrier is a real handover of
// one of b's shards to v, sent after the forged one.
func TestForgedHandoverTakesNothing(t *testing.T) {
	c := newCluster(t, 4, 3*time.Second)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	want, bs := c.replicaLessMember(ctx, lc, "b")
	if len(bs) < 2 {
		t.Fatalf("the assignment gives b %v, fewer than two shards", bs)
	}
	free, barrier := bs[0], bs[1]
	bg, ok, err := lc.Acquire(ctx, shard.Key("ctl", barrier), "b#0", 10*time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	acquired := make(chan int, 64)
	c.acquired = func(_ string, s int) {
		select {
		case acquired <- s:
		default: // the test has what it needs
		}
	}
	v := c.start("v").r
	for s, m := range want {
		if m == "v" {
			waitFor(t, fmt.Sprintf("v owning shard %d", s), func() bool { return v.Owns(s) })
		}
	}
	waitFor(t, fmt.Sprintf("v registered as the candidate of shard %d", barrier), func() bool {
		_, cands, err := handover.Candidates(ctx, lc, shard.Key("ctl", barrier))
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(cands, func(x handover.CandidateState) bool { return x.Owner == v.Owner() && x.Rank == 1 })
	})

	forger := fmt.Sprintf("shard_forger_%d", time.Now().UnixNano())
	if _, err := c.pool.Exec(ctx, `CREATE ROLE `+forger+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+forger) })
	fc := pgtest.Connect(t, pgtest.WithUser(c.dsn, forger))
	payload := fmt.Sprintf(`{"event":"handover","key":%q,"owner":%q,"epoch":1}`, shard.Key("ctl", free), v.Owner())
	if _, err := fc.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
		t.Fatal(err)
	}
	if err := lc.Release(ctx, bg.Token); err != nil {
		t.Fatal(err)
	}
	// The barrier taken (by the notification's acquire or a round): the
	// forged notification, sent before it, has been acted on.
	for s := range acquired {
		if s == barrier {
			break
		}
	}
	var took int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM lease.history WHERE key = $1 AND owner = $2`,
		shard.Key("ctl", free), v.Owner()).Scan(&took); err != nil {
		t.Fatal(err)
	}
	if took > 0 {
		t.Errorf("a forged handover made v take shard %d, which the assignment gives to b (%d events)", free, took)
	}
}

// TestCrashTakenOverInOneStatementPerReplica: a replica that joined and
// took its shards, one handover after another, crashes at once; every
// other replica takes the crashed replica's shards that Balance gives it
// in one acquire statement, with no acquire before or after it, asked at
// the instant the crashed replica's grants lapse (the statement waits on
// the server for it), and every shard is owned again.
func TestCrashTakenOverInOneStatementPerReplica(t *testing.T) {
	c := newCluster(t, 64, 3*time.Second)
	sent := map[string]*pgtest.Statements{}
	for _, id := range []string{"a", "b", "c", "y"} {
		sent[id] = &pgtest.Statements{}
		c.poolOpts = []pgtest.PoolOption{sent[id].Traced}
		c.start(id)
		if id == "c" {
			c.waitSettled("a", "b", "c")
		}
	}
	c.poolOpts = nil
	c.waitSettled("a", "b", "c", "y")
	ys := slices.Clone(c.replicas["y"].r.Owned())
	before := map[string]int{}
	for id, n := range sent {
		before[id] = len(n.Calling("lease.acquire"))
	}
	y := c.replicas["y"]
	y.cancel(shard.ErrCrash)
	t.Logf("y crashes holding %v: settled in %v", ys, c.waitSettled("a", "b", "c"))
	<-y.done
	c.checkNoOverlap()
	ctx := pgtest.Context(t, 0)
	for _, id := range []string{"a", "b", "c"} {
		var got []string
		for _, s := range c.replicas[id].r.Owned() {
			if slices.Contains(ys, s) {
				got = append(got, shard.Key("ctl", s))
			}
		}
		acquires := sent[id].Calling("lease.acquire")[before[id]:]
		if len(got) == 0 {
			if len(acquires) != 0 {
				t.Errorf("%s took none of y's shards in %d acquire statements", id, len(acquires))
			}
			continue
		}
		if len(acquires) != 1 {
			t.Errorf("%s took y's shards %v in %d acquire statements, want 1", id, got, len(acquires))
			continue
		}
		// y's grants lapsed at one instant, on the server's clock: the
		// takeovers recorded it as the keys' vacancy.
		var lapsed time.Time
		if err := c.pool.QueryRow(ctx, `SELECT max(vacant_since) FROM lease.history
WHERE key = ANY($1) AND event = 'taken_over' AND owner = $2`, got, c.replicas[id].r.Owner()).Scan(&lapsed); err != nil {
			t.Fatal(err)
		}
		st := acquires[0]
		if len(st.Args) < 4 {
			t.Errorf("%s took y's shards asking at once (%d arguments), not at their lapse", id, len(st.Args))
			continue
		}
		if at, ok := st.Args[3].(time.Time); !ok || !at.Equal(lapsed) {
			t.Errorf("%s took y's shards asked at %v, want %v (their lapse)", id, st.Args[3], lapsed)
		}
	}
}

// TestCrashWithKeysLapsingApartTakenOverInOneStatement: a member that
// crashed between a take and the renewal of all its keys at once holds
// keys that lapse apart. Each other replica takes the crashed member's
// shards that Balance gives it in one acquire statement, asked at the last
// lapse of those it takes (or at the member key's), not some of them in a
// statement of their own a round after the member key's lapse:
//   - the grants of its last take lapse after its member key and the
//     rest: those lapsed first wait for them;
//   - a grant handed to it lapses before its member key (it renewed its
//     keys before taking that grant): that shard is free while the member
//     lives, assigned to it, and is taken with the rest at the member key's
//     lapse.
//
// Member y runs no replica: the test holds its keys (owner y#0), then
// renews them as such a crash leaves them, each other replica's share of
// y's shards split between two instants.
func TestCrashWithKeysLapsingApartTakenOverInOneStatement(t *testing.T) {
	for _, tc := range []struct {
		name        string
		first, rest time.Duration // the TTLs of each share's first half and rest
	}{
		{"last take unrenewed", 2 * time.Second, 3500 * time.Millisecond},
		{"handed grant lapsed first", time.Second, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { crashWithKeysLapsingApart(t, tc.first, tc.rest) })
	}
}

// crashWithKeysLapsingApart renews y's member key for 2 s and, of each
// other replica's share of y's shards, the first half for first and the
// rest for rest.
func crashWithKeysLapsingApart(t *testing.T, first, rest time.Duration) {
	c := newCluster(t, 64, 3*time.Second)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	members, live := []string{"a", "b", "c", "y"}, []string{"a", "b", "c"}
	member, ok, err := lc.Acquire(ctx, shard.MemberKey("ctl", "y"), "y#0", 10*time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var ys []int
	var keys []string
	for s, m := range shard.Assign(c.n, members) {
		if m == "y" {
			ys, keys = append(ys, s), append(keys, shard.Key("ctl", s))
		}
	}
	grants, denied, err := lc.AcquireMany(ctx, keys, "y#0", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[int]lease.Token{}
	for i, s := range ys {
		if denied[i] != nil || grants[i].Epoch == 0 {
			t.Fatalf("y's shard %d not acquired: %v", s, denied[i])
		}
		tokens[s] = grants[i].Token
	}
	sent := map[string]*pgtest.Statements{}
	for _, id := range live {
		sent[id] = &pgtest.Statements{}
		c.poolOpts = []pgtest.PoolOption{sent[id].Traced}
		c.start(id)
	}
	c.poolOpts = nil
	var holders []string
	waitFor(t, "a, b and c owning every shard but y's as Balance gives it", func() bool {
		holders = make([]string, c.n)
		for _, s := range ys {
			holders[s] = "y"
		}
		for _, id := range live {
			for _, s := range c.replicas[id].r.Owned() {
				if holders[s] != "" {
					return false
				}
				holders[s] = id
			}
		}
		return !slices.Contains(holders, "") && slices.Equal(holders, shard.Balance(c.n, members, holders))
	})
	without := slices.Clone(holders)
	for _, s := range ys {
		without[s] = ""
	}
	after := shard.Balance(c.n, live, without)
	want := map[string][]int{}
	for _, s := range ys {
		want[after[s]] = append(want[after[s]], s)
	}
	renew := map[time.Duration][]lease.Token{2 * time.Second: {member.Token}}
	for _, id := range live {
		if len(want[id]) < 2 {
			t.Fatalf("Balance without y gives %s %v of y's shards, fewer than two", id, want[id])
		}
		for i, s := range want[id] {
			ttl := rest
			if i < len(want[id])/2 {
				ttl = first
			}
			renew[ttl] = append(renew[ttl], tokens[s])
		}
	}
	before := map[string]int{}
	for id, n := range sent {
		before[id] = len(n.Calling("lease.acquire"))
	}
	expires := map[string]time.Time{} // by key, on the server's clock
	for ttl, ts := range renew {
		gs, errs, err := lc.RenewTokens(ctx, ts, ttl)
		if err != nil || errors.Join(errs...) != nil {
			t.Fatal(err, errs)
		}
		for _, g := range gs {
			expires[g.Key] = g.ExpiresAt
		}
	}
	t.Logf("y's keys lapse apart: settled in %v", c.waitSettled(live...))
	c.checkNoOverlap()
	for _, id := range live {
		var got []int
		for _, s := range c.replicas[id].r.Owned() {
			if slices.Contains(ys, s) {
				got = append(got, s)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want[id]) {
			t.Errorf("%s owns y's shards %v, want %v", id, got, want[id])
		}
		acquires := sent[id].Calling("lease.acquire")[before[id]:]
		if len(acquires) != 1 {
			t.Errorf("%s took y's shards %v in %d acquire statements, want 1", id, want[id], len(acquires))
			continue
		}
		// The last lapse of y's member key and of the shards taken.
		lapsed := expires[shard.MemberKey("ctl", "y")]
		for _, s := range got {
			if e := expires[shard.Key("ctl", s)]; e.After(lapsed) {
				lapsed = e
			}
		}
		if st := acquires[0]; len(st.Args) < 4 {
			t.Errorf("%s took y's shards asking at once (%d arguments), not at their last lapse", id, len(st.Args))
		} else if at, ok := st.Args[3].(time.Time); !ok || !at.Equal(lapsed) {
			t.Errorf("%s took y's shards asked at %v, want %v (their last lapse)", id, st.Args[3], lapsed)
		}
	}
}

// roundGate holds back a replica's round lists (lease.list() of every key)
// while closed, and records when each began and the acquire statements.
type roundGate struct {
	mu       sync.Mutex
	closed   chan struct{} // nil while open
	lists    []time.Time
	acquires []pgtest.Statement
}

func (g *roundGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	g.mu.Lock()
	closed := g.closed
	if strings.Contains(d.SQL, "lease.list()") {
		g.lists = append(g.lists, time.Now())
	} else {
		closed = nil
	}
	if strings.Contains(d.SQL, "lease.acquire(") {
		g.acquires = append(g.acquires, pgtest.Statement{At: time.Now(), SQL: d.SQL, Args: append([]any(nil), d.Args...)})
	}
	g.mu.Unlock()
	if closed != nil {
		<-closed
	}
	return ctx
}

func (g *roundGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (g *roundGate) setClosed(closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case closed && g.closed == nil:
		g.closed = make(chan struct{})
	case !closed && g.closed != nil:
		close(g.closed)
		g.closed = nil
	}
}

// TestCrashTakenOverWhileARoundWaits: a replica sends its takeover of a
// crashed member's shards at the instant its last plan set, whatever
// statement its round is waiting for then: here its rounds' lists are held
// back from just after the one that saw the member's last renewal, and it
// still takes y's shards, in one statement asked at the lapse. Member y
// runs no replica: the test holds and renews its keys (owner y#0); a is
// the only other member (a plan of another live member's takeover would
// go stale while a's rounds wait).
func TestCrashTakenOverWhileARoundWaits(t *testing.T) {
	c := newCluster(t, 16, 3*time.Second)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	members, live := []string{"a", "y"}, []string{"a"}
	member, ok, err := lc.Acquire(ctx, shard.MemberKey("ctl", "y"), "y#0", 10*time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ys, tokens := holdShardsOfY(t, ctx, lc, c.n, members, member.Token)
	gate := &roundGate{}
	c.startTraced("a", gate)
	t.Cleanup(func() { gate.setClosed(false) }) // before the replicas stop
	var holders []string
	waitFor(t, "a owning every shard but y's", func() bool {
		holders = make([]string, c.n)
		for _, s := range ys {
			holders[s] = "y"
		}
		for _, id := range live {
			for _, s := range c.replicas[id].r.Owned() {
				if holders[s] != "" {
					return false
				}
				holders[s] = id
			}
		}
		return !slices.Contains(holders, "") && slices.Equal(holders, shard.Balance(c.n, members, holders))
	})
	for _, s := range ys {
		holders[s] = ""
	}
	after := shard.Balance(c.n, live, holders)
	var want []int
	for _, s := range ys {
		if after[s] == "a" {
			want = append(want, s)
		}
	}
	if len(want) == 0 {
		t.Fatal("Balance without y gives a none of y's shards")
	}
	// y's last renewal: its keys lapse 3 s after it. Once a round of a's
	// lists after it, a's next lists wait until a owns y's shards.
	gs, errs, err := lc.RenewTokens(ctx, tokens, 3*time.Second)
	if err != nil || errors.Join(errs...) != nil {
		t.Fatal(err, errs)
	}
	renewed := time.Now()
	waitFor(t, "a listing after y's last renewal", func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return len(gate.lists) > 0 && gate.lists[len(gate.lists)-1].After(renewed)
	})
	gate.setClosed(true)
	gate.mu.Lock()
	before := len(gate.acquires)
	gate.mu.Unlock()
	a := c.replicas["a"].r
	waitFor(t, fmt.Sprintf("a owning y's shards %v with its rounds held back", want), func() bool {
		for _, s := range want {
			if !a.Owns(s) {
				return false
			}
		}
		return true
	})
	gate.mu.Lock()
	acquires := slices.Clone(gate.acquires[before:])
	gate.mu.Unlock()
	lapse := gs[0].ExpiresAt // y's member key's, then its shards' taken
	for i, s := range ys {
		if slices.Contains(want, s) && gs[1+i].ExpiresAt.After(lapse) {
			lapse = gs[1+i].ExpiresAt
		}
	}
	if len(acquires) != 1 {
		t.Fatalf("a took y's shards %v in %d acquire statements, want 1", want, len(acquires))
	}
	if st := acquires[0]; len(st.Args) < 4 {
		t.Errorf("a took y's shards asking at once (%d arguments), not at their lapse", len(st.Args))
	} else if at, ok := st.Args[3].(time.Time); !ok || !at.Equal(lapse) {
		t.Errorf("a took y's shards asked at %v, want %v (their lapse)", st.Args[3], lapse)
	}
	gate.setClosed(false)
	c.waitSettled(live...)
	c.checkNoOverlap()
}

// TestKeysLapseAtOneInstant: a replica that took shards, in several
// statements as the handovers of a join arrive, renews its member key and
// every shard key at once after each take, so that they all expire at one
// instant: were it to crash, each other replica would take over its shards
// in one statement at that instant. The keep-alive's own rounds are
// minutes away here.
func TestKeysLapseAtOneInstant(t *testing.T) {
	c := newCluster(t, 16, 10*time.Minute)
	c.renew = 9 * time.Minute
	c.start("a")
	c.start("b")
	c.waitSettled("a", "b")
	c.start("y")
	c.waitSettled("a", "b", "y")
	y := c.replicas["y"].r
	lc := lease.New(c.pool)
	var last string
	waitFor(t, "y's keys expiring at one instant", func() bool {
		states, err := lc.List(pgtest.Context(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		expires := map[time.Time][]string{}
		for _, st := range states {
			if st.Held && st.Owner == y.Owner() {
				expires[st.ExpiresAt] = append(expires[st.ExpiresAt], st.Key)
			}
		}
		last = fmt.Sprint(expires)
		return len(expires) == 1 && len(slices.Collect(maps.Values(expires))[0]) == len(y.Owned())+1
	})
	t.Logf("y's keys: %s", last)
}

// renewSeen records the grants (key and epoch) of every lease.renew_many
// statement a pool ran to its end.
type renewSeen struct {
	mu     sync.Mutex
	grants map[string]bool
}

type renewSeenKey struct{}

func (r *renewSeen) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "lease.renew_many(") || len(d.Args) < 3 {
		return ctx
	}
	keys, _ := d.Args[0].([]string)
	epochs, _ := d.Args[2].([]int64)
	var grants []string
	for i := range min(len(keys), len(epochs)) {
		grants = append(grants, fmt.Sprintf("%s@%d", keys[i], epochs[i]))
	}
	return context.WithValue(ctx, renewSeenKey{}, grants)
}

func (r *renewSeen) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	grants, _ := ctx.Value(renewSeenKey{}).([]string)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range grants {
		r.grants[g] = true
	}
}

func (r *renewSeen) seen(key string, epoch int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grants[fmt.Sprintf("%s@%d", key, epoch)]
}

// TestForgedHandoverOfAShardBeingGivenUp: a forged handover notification
// naming the very grant a replica is giving up (its work not ended yet, so
// its release waits) must not make the replica renew that grant nor act
// under the shard again: the server still shows the grant held by the
// replica at that epoch, but the release that follows hands it on, and
// the former owner would act beside the next. The barriers are forged
// notifications of another shard at epochs it never had, whose refused
// renewals v runs after (or with) the first.
func TestForgedHandoverOfAShardBeingGivenUp(t *testing.T) {
	c := newCluster(t, 4, time.Minute)
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	seen := &renewSeen{grants: map[string]bool{}}
	c.poolOpts = []pgtest.PoolOption{func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = seen }}
	var mu sync.Mutex
	var acquired []int
	c.acquired = func(_ string, s int) {
		mu.Lock()
		acquired = append(acquired, s)
		mu.Unlock()
	}
	v := c.start("v").r
	c.waitSettled("v")
	want := shard.Balance(c.n, []string{"b", "v"}, c.last)
	var bs []int
	for s, m := range want {
		if m == "b" {
			bs = append(bs, s)
		}
	}
	if len(bs) < 2 {
		t.Fatalf("assignment %v gives b fewer than two shards", want)
	}
	given, barrier := bs[0], bs[1]
	wctx, done, ok := v.Begin(ctx, given)
	if !ok {
		t.Fatalf("v does not own shard %d", given)
	}
	defer done()
	tok, _ := lease.TokenFromContext(wctx)
	if _, ok, err := lc.Acquire(ctx, shard.MemberKey("ctl", "b"), "b#0", 10*time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	<-wctx.Done() // v gives the shard up; its release waits for this work
	st, err := lc.Inspect(ctx, tok.Key)
	if err != nil || !st.Held || st.Owner != tok.Owner || st.Epoch != tok.Epoch {
		t.Fatalf("shard %d: %+v %v, want still held by %v", given, st, err, tok)
	}
	mu.Lock()
	before := len(acquired)
	mu.Unlock()

	forger := fmt.Sprintf("shard_forger_%d", time.Now().UnixNano())
	if _, err := c.pool.Exec(ctx, `CREATE ROLE `+forger+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+forger) })
	fc := pgtest.Connect(t, pgtest.WithUser(c.dsn, forger))
	notify := func(tk lease.Token) {
		payload := fmt.Sprintf(`{"event":"handover","key":%q,"owner":%q,"epoch":%d}`, tk.Key, tk.Owner, tk.Epoch)
		if _, err := fc.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
			t.Fatal(err)
		}
	}
	notify(tok)
	// Two barriers: the notifications are taken one batch after another,
	// and the second batch's statement begins once the first is done.
	for _, epoch := range []int64{1 << 40, 1 << 41} {
		notify(lease.Token{Key: shard.Key("ctl", barrier), Owner: v.Owner(), Epoch: epoch})
		waitFor(t, "v's refused renewal of a barrier", func() bool { return seen.seen(shard.Key("ctl", barrier), epoch) })
	}
	mu.Lock()
	after := slices.Clone(acquired[before:])
	mu.Unlock()
	if slices.Contains(after, given) || v.Owns(given) {
		t.Errorf("a forged handover made v act again under shard %d, which it is giving up (acquired %v, owns %v)", given, after, v.Owned())
	}
	if now, err := lc.Inspect(ctx, tok.Key); err != nil || now.Epoch != tok.Epoch || !now.Held || !now.ExpiresAt.Equal(st.ExpiresAt) {
		t.Errorf("a forged handover made v renew or release shard %d before its work ended: %+v, was %+v (%v)", given, now, st, err)
	}
}

// renewGate records the key lists of a pool's lease.renew_many statements
// in order, and while closed holds back its rounds' lists of every key and
// the renewal of exactly the keys of hold (a handover's take).
type renewGate struct {
	hold   []string
	mu     sync.Mutex
	closed chan struct{} // nil while open
	held   int           // the take held back
	renews [][]string
}

func (g *renewGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	var keys []string
	if strings.Contains(d.SQL, "lease.renew_many(") && len(d.Args) > 0 {
		keys, _ = d.Args[0].([]string)
	}
	g.mu.Lock()
	if keys != nil {
		g.renews = append(g.renews, slices.Clone(keys))
	}
	closed := g.closed
	hold := closed != nil && (strings.Contains(d.SQL, "lease.list()") || keys != nil && slices.Equal(keys, g.hold))
	if hold && keys != nil {
		g.held++
	}
	g.mu.Unlock()
	if hold {
		<-closed
	}
	return ctx
}

func (g *renewGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (g *renewGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// TestHandoversNotifiedMeanwhileTakenBeforeTheRenewal: handovers notified
// while a replica's take of an earlier one runs are taken next, before the
// renewal of every key of the replica (align): a shard of one release
// whose notification came a moment after the others waits for one
// statement, not for that renewal too. Member b is live but runs no
// replica; its two shards are released by the test one after the other,
// each handed to v (b's runner-up); v's take of the first is held back
// until the second is queued (a notification sent after it reached v's
// Waiter), and v's rounds are held back throughout.
func TestHandoversNotifiedMeanwhileTakenBeforeTheRenewal(t *testing.T) {
	c := newCluster(t, 4, 10*time.Minute)
	c.renew = 9 * time.Minute
	ctx := pgtest.Context(t, 0)
	lc := lease.New(c.pool)
	want, bs := c.replicaLessMember(ctx, lc, "b")
	if len(bs) != 2 {
		t.Fatalf("the assignment gives b %v, want 2 shards", bs)
	}
	var bts []lease.Token
	for _, s := range bs {
		g, ok, err := lc.Acquire(ctx, shard.Key("ctl", s), "b#0", 10*time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		bts = append(bts, g.Token)
	}
	gate := &renewGate{hold: []string{shard.Key("ctl", bs[0])}}
	defer gate.open()
	rep := c.startTraced("v", gate)
	v := rep.r
	for s, m := range want {
		if m == "v" {
			waitFor(t, fmt.Sprintf("v owning shard %d", s), func() bool { return v.Owns(s) })
		}
	}
	for _, s := range bs {
		waitFor(t, fmt.Sprintf("v registered as the candidate of shard %d", s), func() bool {
			_, cands, err := handover.Candidates(ctx, lc, shard.Key("ctl", s))
			if err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(cands, func(x handover.CandidateState) bool { return x.Owner == v.Owner() && x.Rank == 1 })
		})
	}
	barrier := listen.Subscribe(ctx, rep.w, clock.RealClock{}, "ctl/barrier")
	defer barrier.Close()

	gate.mu.Lock()
	gate.closed = make(chan struct{})
	gate.mu.Unlock()
	if err := lc.Release(ctx, bts[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("v's take of shard %d held back", bs[0]), func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return gate.held == 1
	})
	if err := lc.Release(ctx, bts[1]); err != nil {
		t.Fatal(err)
	}
	// The Waiter dispatches notifications one after another: once the
	// barrier's reached the test, the second handover's reached v's take.
	if _, err := c.pool.Exec(ctx, `SELECT pg_notify('pg_lease', '{"event":"released","key":"ctl/barrier","owner":"x","epoch":1}')`); err != nil {
		t.Fatal(err)
	}
	for {
		wk, err := barrier.Wait(ctx, time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(wk.Events, func(ev listen.Event) bool { return ev.Key == "ctl/barrier" }) {
			break
		}
	}
	gate.open()
	// The take of the second shard, sent: not v.Owns, since b is live and
	// v's next round gives both shards up again (they are b's).
	second := []string{shard.Key("ctl", bs[1])}
	waitFor(t, fmt.Sprintf("v's take of shard %d", bs[1]), func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return slices.ContainsFunc(gate.renews, func(keys []string) bool { return slices.Equal(keys, second) })
	})
	gate.mu.Lock()
	renews := slices.Clone(gate.renews)
	gate.mu.Unlock()
	i := slices.IndexFunc(renews, func(keys []string) bool { return slices.Equal(keys, gate.hold) })
	if i < 0 || i+1 >= len(renews) || !slices.Equal(renews[i+1], second) {
		t.Errorf("v's renewals %q: want the take of %s followed by the take of %s", renews, gate.hold, second)
	}
}

// floodGate, on a replica's pool, keeps a flood of forged handover
// notifications going: before each renewal of exactly the forged key (the
// replica's take of a forged handover) it sends another forged handover of
// that key and waits until it reached the replica's Waiter, so the take
// always finds one more queued after it. While held, it holds back the
// replica's rounds' lists of every key.
type floodGate struct {
	key    string
	notify func(epoch int64) // the forged handover, then the barrier, seen
	mu     sync.Mutex
	held   chan struct{} // nil once the rounds run
	takes  int64
	done   bool
}

func (g *floodGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	var keys []string
	if strings.Contains(d.SQL, "lease.renew_many(") && len(d.Args) > 0 {
		keys, _ = d.Args[0].([]string)
	}
	g.mu.Lock()
	held := g.held
	take := slices.Equal(keys, []string{g.key}) && !g.done
	if take {
		g.takes++
	}
	epoch := g.takes + 1
	g.mu.Unlock()
	if take {
		g.notify(epoch)
	}
	if held != nil && strings.Contains(d.SQL, "lease.list()") {
		<-held
	}
	return ctx
}

func (g *floodGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (g *floodGate) count() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.takes
}

// TestForgedHandoverFloodLeavesTheRoundsRunning: any role may NOTIFY
// pg_lease, as often as it likes. A flood of forged handovers naming a
// replica's owner and a shard it does not hold, each arriving while the
// replica's take of the one before runs, must not keep the replica taking
// for ever: its rounds (takeovers, joins, leaves, the shards it must take
// or give up) go on. Replica v is alone; its first round is held back
// until the flood has made it take twice, then it must take every shard.
func TestForgedHandoverFloodLeavesTheRoundsRunning(t *testing.T) {
	c := newCluster(t, 4, time.Minute)
	ctx := pgtest.Context(t, 0)
	forger := fmt.Sprintf("shard_forger_%d", time.Now().UnixNano())
	if _, err := c.pool.Exec(ctx, `CREATE ROLE `+forger+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+forger) })
	fc := pgtest.Connect(t, pgtest.WithUser(c.dsn, forger))
	var fmu sync.Mutex // fc is one connection
	var owner string
	var barrier *listen.Changes
	send := func(key string, epoch int64) {
		fmu.Lock()
		defer fmu.Unlock()
		payload := fmt.Sprintf(`{"event":"handover","key":%q,"owner":%q,"epoch":%d}`, key, owner, epoch)
		if _, err := fc.Exec(ctx, `SELECT pg_notify('pg_lease', $1)`, payload); err != nil {
			t.Error(err)
		}
	}
	gate := &floodGate{key: shard.Key("ctl", 0), held: make(chan struct{})}
	var bseq int64
	gate.notify = func(epoch int64) {
		send(gate.key, epoch)
		// The Waiter dispatches notifications one after another: once the
		// barrier reached the test, the forged one reached v's take.
		fmu.Lock()
		bseq++
		b := bseq
		fmu.Unlock()
		send("ctl/barrier", b)
		for ctx.Err() == nil {
			wk, err := barrier.Wait(ctx, time.Time{}, nil)
			if err != nil || wk.Closed || slices.ContainsFunc(wk.Events, func(ev listen.Event) bool { return ev.Epoch == b }) {
				return
			}
		}
	}
	rep := c.startTraced("v", gate)
	v := rep.r
	t.Cleanup(func() {
		gate.mu.Lock()
		gate.done = true
		if gate.held != nil {
			close(gate.held)
			gate.held = nil
		}
		gate.mu.Unlock()
	})
	fmu.Lock()
	owner = v.Owner()
	fmu.Unlock()
	barrier = listen.Subscribe(ctx, rep.w, clock.RealClock{}, "ctl/barrier")
	defer barrier.Close()
	// v's subscription may begin after this test's: forged handovers until
	// v takes one; from then on each take sends the next.
	waitFor(t, "v's take of a forged handover", func() bool {
		if gate.count() > 0 {
			return true
		}
		send(gate.key, 1)
		return false
	})
	waitFor(t, "v's take of a forged handover notified during the one before", func() bool { return gate.count() >= 2 })
	gate.mu.Lock()
	close(gate.held)
	gate.held = nil
	gate.mu.Unlock()
	for s := range c.n {
		waitFor(t, fmt.Sprintf("v owning shard %d beside the flood", s), func() bool { return v.Owns(s) })
	}
	t.Logf("v took %d forged handovers", gate.count())
}
