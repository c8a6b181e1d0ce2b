package hostile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/pglease/pg_lease/pkg/elector"
	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
	"github.com/pglease/pg_lease/pkg/resourcelock"
	"github.com/pglease/pg_lease/pkg/shard"
)

// The honest parts' timings. Each party's statement limit (check 3) is ten
// times what its cadence makes it send: statements per cycle over the
// shortest pause of its design.
const (
	honestTTL = 3 * time.Second

	electorRenew = time.Second
	electorRetry = 300 * time.Millisecond
	// An elector's cycle as a follower: acquire, the Await's read, and
	// the listener's registration of the key.
	electorPerCycle = 4

	// client-go: RetryPeriod from resourcelock.Timing for the TTL (400 ms);
	// a cycle is Get, Update, and the candidacy's registration.
	clientGoPerCycle = 4

	shardPoll = 200 * time.Millisecond
	// A shard round: list, acquire, release, registrations, renewal, and
	// the member key's announce.
	shardPerCycle = 8

	handoverPoll     = 100 * time.Millisecond
	handoverPerCycle = 3

	probeEvery    = 150 * time.Millisecond
	probePerCycle = 6
)

func limit(perCycle int, pause time.Duration) float64 {
	return 10 * float64(perCycle) / pause.Seconds()
}

// termOf records the believed term of the token ctx carries, from start to
// the earlier of ended and the term's local deadline (ctx is a term
// context: its Deadline moves with renewals, and is final once it is done).
func (e *env) termOf(ctx context.Context, key, party, role string, start time.Duration, ended time.Duration) {
	end := ended
	if dl, ok := ctx.Deadline(); ok {
		if d := e.rec.At(dl); d < end {
			end = d
		}
	}
	tok, _ := lease.TokenFromContext(ctx)
	e.rec.Term(Term{Key: key, Party: party, Role: role, Epoch: tok.Epoch, Start: start, End: end})
}

// runElector runs one pkg/elector candidate, restarted now and then: each
// incarnation is a new process (its own pool and listener, which registers
// its keys anew), with a fixed identity, and resigns its terms after a
// while.
func (e *env) runElector(ctx context.Context, id string, seed int64) error {
	rnd := rand.New(rand.NewSource(seed))
	for n := 0; ctx.Err() == nil; n++ {
		life, cancel := context.WithTimeout(ctx, between(rnd, 5*time.Second, 12*time.Second))
		err := e.electorIncarnation(life, id, n, rnd.Int63())
		cancel()
		if err != nil {
			return err
		}
		sleep(ctx, between(rnd, 100*time.Millisecond, 800*time.Millisecond))
	}
	return nil
}

func (e *env) electorIncarnation(ctx context.Context, id string, n int, seed int64) error {
	party := fmt.Sprintf("elector/%s#%d", id, n)
	pool, err := e.honestPool(ctx, roleElector, "elector/"+id, limit(electorPerCycle, electorRetry), 3)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer w.Close()
	rnd := rand.New(rand.NewSource(seed))
	var rmu sync.Mutex
	hold := func() time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return between(rnd, 500*time.Millisecond, 2500*time.Millisecond)
	}
	el, err := elector.New(lease.New(pool), elector.Config{
		Key: electorKey, Identity: id, TTL: honestTTL, RenewInterval: electorRenew, RetryInterval: electorRetry,
		Waiter: w,
		Callbacks: elector.Callbacks{
			OnStartedLeading: func(lctx context.Context) {
				start := e.rec.Now()
				tok, _ := lease.TokenFromContext(lctx)
				e.rec.Observe(electorKey, party, "term", tok.Epoch, -1, start)
				sleep(lctx, hold()) // resign after a while: handoffs
				e.termOf(lctx, electorKey, party, roleElector, start, e.rec.Now())
				e.rec.Count("terms: elector", 1)
			},
			OnNewLeader: func(identity string, epoch int64) {
				e.rec.Observe(electorKey, party, "OnNewLeader", epoch, -1, e.rec.Now())
			},
		},
	})
	if err != nil {
		return err
	}
	return ignoreStop(ctx, el.Run(ctx))
}

// ignoreStop drops err when ctx ended: a part stopping.
func ignoreStop(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// cgCandidate is one client-go process: a real leaderelection.LeaderElector
// over a pkg/resourcelock Lock, seen through a wrapper that times its calls.
type cgCandidate struct {
	e     *env
	id    string
	party string
	lock  *resourcelock.Lock
	le    atomic.Pointer[leaderelection.LeaderElector]

	mu        sync.Mutex
	getStart  time.Duration // start of the last Get that returned a record
	gets      int
	starts    map[int64]time.Duration
	deadlines map[int64]time.Duration
}

var _ rl.Interface = (*cgCandidate)(nil)

// got records a Get that started at start and returned a record: what
// client-go's IsLeader reflects once it has returned.
func (c *cgCandidate) got(start time.Duration) {
	c.mu.Lock()
	if start > c.getStart {
		c.getStart = start
	}
	c.gets++
	c.mu.Unlock()
}

// lastGet is the start of the lock's last Get that returned a record.
func (c *cgCandidate) lastGet() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.getStart, c.gets > 0
}

// noteTerm records the live term's deadline, which every successful Create
// or Update may move.
func (c *cgCandidate) noteTerm() {
	if _, ok := c.lock.Token(); !ok {
		return
	}
	tctx, cancel, err := c.lock.TokenContext(context.Background())
	if err != nil {
		return
	}
	tok, _ := lease.TokenFromContext(tctx)
	dl, _ := tctx.Deadline()
	cancel()
	c.mu.Lock()
	if d := c.e.rec.At(dl); d > c.deadlines[tok.Epoch] {
		c.deadlines[tok.Epoch] = d
	}
	c.mu.Unlock()
}

func (c *cgCandidate) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	start := c.e.rec.Now()
	r, raw, err := c.lock.Get(ctx)
	if err == nil && r != nil {
		c.e.rec.Observe(clientGoKey, c.party, "Get", int64(r.LeaderTransitions), -1, c.e.rec.Now())
		c.got(start)
	}
	return r, raw, err
}

func (c *cgCandidate) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := c.lock.Create(ctx, ler)
	c.noteTerm()
	return err
}

func (c *cgCandidate) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := c.lock.Update(ctx, ler)
	c.noteTerm()
	return err
}

func (c *cgCandidate) RecordEvent(s string) { c.lock.RecordEvent(s) }
func (c *cgCandidate) Identity() string     { return c.lock.Identity() }
func (c *cgCandidate) Describe() string     { return c.lock.Describe() }

// epochChange is the lock's OnEpochChange: a term believed from its start
// to its end, clipped to the last deadline the lock handed out. A term the
// lock never handed out (it ended before its Update returned) is none.
func (c *cgCandidate) epochChange(old, new lease.Token) {
	now := c.e.rec.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if new.Epoch != 0 {
		c.starts[new.Epoch] = now
		c.e.rec.Observe(clientGoKey, c.party, "term", new.Epoch, -1, now)
	}
	if old.Epoch != 0 {
		start, ok := c.starts[old.Epoch]
		dl, live := c.deadlines[old.Epoch]
		delete(c.starts, old.Epoch)
		delete(c.deadlines, old.Epoch)
		if ok && live {
			c.e.rec.Term(Term{Key: clientGoKey, Party: c.party, Role: roleClientGo, Epoch: old.Epoch, Start: start, End: min(now, dl)})
			c.e.rec.Count("terms: client-go", 1)
		}
	}
}

// runClientGo runs one client-go candidate, restarted now and then: each
// incarnation is a new process with its own pool, listener and Lock (with
// a handover candidacy), running a LeaderElector that releases on cancel.
func (e *env) runClientGo(ctx context.Context, id string, seed int64) error {
	rnd := rand.New(rand.NewSource(seed))
	for n := 0; ctx.Err() == nil; n++ {
		life, cancel := context.WithTimeout(ctx, between(rnd, 2*time.Second, 6*time.Second))
		err := e.clientGoIncarnation(life, id, n)
		cancel()
		if err != nil {
			return err
		}
		sleep(ctx, between(rnd, 200*time.Millisecond, time.Second))
	}
	return nil
}

func (e *env) clientGoIncarnation(ctx context.Context, id string, n int) error {
	cfg, err := resourcelock.Timing(honestTTL, 0, leaderelection.LeaderElectionConfig{})
	if err != nil {
		return err
	}
	pool, err := e.honestPool(ctx, roleClientGo, "client-go/"+id, limit(clientGoPerCycle, cfg.RetryPeriod), 3)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer w.Close()
	c := &cgCandidate{e: e, id: id, party: fmt.Sprintf("client-go/%s#%d", id, n),
		starts: map[int64]time.Duration{}, deadlines: map[int64]time.Duration{}}
	c.lock, err = resourcelock.New(lease.New(pool), resourcelock.Config{
		Key: clientGoKey, Identity: id,
		LeaseDuration: honestTTL, Waiter: w, OnEpochChange: c.epochChange,
		Candidacy: &handover.Candidacy{Strategy: handover.StrategyPriority, Priority: 10},
	})
	if err != nil {
		return err
	}
	cfg.Lock, cfg.Name, cfg.ReleaseOnCancel = c, clientGoKey, true
	cfg.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(context.Context) { e.rec.Count("leading: client-go", 1) },
		OnStoppedLeading: func() {},
	}
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return err
	}
	e.cgMu.Lock()
	e.cgs = append(e.cgs, c)
	e.cgMu.Unlock()
	defer func() {
		e.cgMu.Lock()
		defer e.cgMu.Unlock()
		e.cgs = slices.DeleteFunc(e.cgs, func(x *cgCandidate) bool { return x == c })
	}()
	// client-go logs through the context's logger: keep the output to the
	// report.
	c.le.Store(le)
	le.Run(klog.NewContext(ctx, logr.Discard()))
	c.le.Store(nil)
	return nil
}

// runShard runs one replica of a pkg/shard controller, restarted now and
// then, each incarnation a new process with its own pool and listener;
// each shard it acquires is worked on (Begin) until its context ends, and
// that is the believed term.
func (e *env) runShard(ctx context.Context, id string, seed int64) error {
	rnd := rand.New(rand.NewSource(seed))
	for ctx.Err() == nil {
		life, cancel := context.WithTimeout(ctx, between(rnd, 4*time.Second, 10*time.Second))
		err := e.shardIncarnation(life, id)
		cancel()
		if err != nil {
			return err
		}
		sleep(ctx, between(rnd, 300*time.Millisecond, 1500*time.Millisecond))
	}
	return nil
}

func (e *env) shardIncarnation(ctx context.Context, id string) error {
	pool, err := e.honestPool(ctx, roleShard, "shard/"+id, limit(shardPerCycle, shardPoll), 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := listen.NewWaiter(ctx, pool.Config().ConnConfig, listen.Options{})
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer w.Close()
	var work sync.WaitGroup
	defer work.Wait()
	var s *shard.Sharder
	s, err = shard.New(shard.Config{
		Client: lease.New(pool), Controller: shardController, Shards: shardCount, Identity: id,
		TTL: honestTTL, Poll: shardPoll, Waiter: w, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnAcquired: func(n int) {
			work.Add(1)
			go func() {
				defer work.Done()
				e.workShard(s, n)
			}()
		},
	})
	if err != nil {
		return err
	}
	if err := s.Run(ctx); err != nil && !errors.Is(err, shard.ErrIdentityTaken) {
		return ignoreStop(ctx, err)
	}
	return nil
}

// workShard works on shard n while s owns it: the believed term.
func (e *env) workShard(s *shard.Sharder, n int) {
	wctx, done, ok := s.Begin(context.Background(), n)
	if !ok {
		return
	}
	start := e.rec.Now()
	key := shard.Key(shardController, n)
	party := "shard/" + s.Owner()
	tok, _ := lease.TokenFromContext(wctx)
	e.rec.Observe(key, party, "term", tok.Epoch, -1, start)
	<-wctx.Done()
	e.termOf(wctx, key, party, roleShard, start, e.rec.Now())
	done()
	e.rec.Count("terms: shard", 1)
}

// runHandover is one of two processes that hand a key to each other: the
// holder sets the priority strategy, holds a while, and releases; the
// follower keeps itself registered as a candidate and takes up a grant
// handed to it, or races for a free key. After each release the new holder
// must be a candidate of the releasing role (check 2).
func (e *env) runHandover(ctx context.Context, id string, seed int64) error {
	party := "handover/" + id
	pool, err := e.honestPool(ctx, roleHandover, party, limit(handoverPerCycle, handoverPoll), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	c := lease.New(pool)
	rnd := rand.New(rand.NewSource(seed))
	var registered time.Duration = -time.Hour
	for ctx.Err() == nil {
		// Follow: registered as a candidate; take a grant handed over, or
		// a free key.
		if e.rec.Now()-registered > time.Second {
			if _, err := handover.Register(ctx, c, handoverKey, handover.Candidate{
				Owner: id, Priority: 5, Ready: true, TTL: honestTTL,
			}); err == nil {
				registered = e.rec.Now()
			} else if ctx.Err() == nil {
				e.rec.Count("handover: registration refused or failed", 1)
			}
		}
		sent := e.rec.Now()
		st, err := c.Inspect(ctx, handoverKey)
		if err != nil {
			sleep(ctx, handoverPoll)
			continue
		}
		e.rec.Observe(handoverKey, party, "inspect", st.Epoch, sent, e.rec.Now())
		if st.Held && st.Owner != id {
			sleep(ctx, handoverPoll)
			continue
		}
		g, ok, err := c.Acquire(ctx, handoverKey, id, honestTTL)
		if err != nil || !ok {
			sleep(ctx, handoverPoll)
			continue
		}
		if err := e.holdAndHandOver(ctx, c, g, id, party, rnd); err != nil {
			return err
		}
	}
	return nil
}

// holdAndHandOver leads under g for a while, renewing, then releases and
// judges where the key went.
func (e *env) holdAndHandOver(ctx context.Context, c *lease.Client, g lease.Grant, id, party string, rnd *rand.Rand) error {
	start := e.rec.Now()
	e.rec.Observe(handoverKey, party, "term", g.Epoch, -1, start)
	t, err := c.Begin(g, 0, nil)
	if err != nil {
		return err
	}
	tctx, cancel := t.Context(context.Background())
	defer cancel()
	// The releasing role chooses how its key is handed over.
	if _, err := handover.SetStrategy(ctx, c, handoverKey, handover.StrategyPriority); errors.Is(err, lease.ErrPermission) {
		if !e.judged(handoverKey+"/strategy", 0) {
			e.rec.Violate(CheckHandover, "%s holds %s but may not choose its strategy: %v (another role bound it, and that role's strategy decides where the holder's releases go)",
				party, handoverKey, err)
		}
	}
	until := e.rec.Now() + between(rnd, 500*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil && t.Err() == nil && e.rec.Now() < until {
		if !sleepUntil(ctx, t.Done(), min(electorRenew, until-e.rec.Now())) {
			break
		}
		if e.rec.Now() < until {
			_ = t.Renew(ctx)
		}
	}
	end := e.rec.Now()
	e.termOf(tctx, handoverKey, party, roleHandover, start, end)
	e.rec.Count("terms: handover", 1)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), honestTTL)
	defer rcancel()
	if err := t.Release(rctx); err != nil {
		return nil // lost or lapsed: nothing was handed over by us
	}
	e.judgeRelease(rctx, handoverKey, g.Epoch, roleHandover, party)
	return nil
}

// sleepUntil waits d, or until ctx ends or done closes; true after d.
func sleepUntil(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-done:
	}
	return false
}

// judgeRelease reads, as the installer, where key went after role released
// its grant of epoch: a grant at epoch+1 can only be the release's
// handover (a release without one leaves the counter at epoch+1, and the
// next grant above it). That grant must be to a candidate of role.
func (e *env) judgeRelease(ctx context.Context, key string, epoch int64, role, party string) {
	var (
		owner, holderRole *string
		cur               int64
	)
	err := e.admin.QueryRow(ctx, `SELECT owner, epoch, holder_role FROM lease.leases WHERE key = $1`, key).
		Scan(&owner, &cur, &holderRole)
	if err != nil || cur != epoch+1 || owner == nil {
		return
	}
	e.rec.Count("handovers: "+key, 1)
	if holderRole != nil && *holderRole != role && !e.judged(key, cur) {
		e.rec.Violate(CheckHandover, "%s released %s epoch %d; the release handed it to %q of role %s, not a candidate of %s",
			party, key, epoch, *owner, *holderRole, role)
	}
}

// runProbe is check (1) on one probe key, which the hostile roles touch
// with every call that grants nothing: register for it (listen), read it;
// when it is free, a wait-0 acquire must be granted. A denial while the key reads free before and
// after at the same epoch (nobody was granted it in between) is a
// violation. A grant is released at once, and where it went is judged
// (check 2: the probe registers no candidate, so nothing may be handed).
func (e *env) runProbe(ctx context.Context, key string, seed int64) error {
	party := "probe/" + key
	pool, err := e.honestPool(ctx, roleProbe, party, limit(probePerCycle, probeEvery), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	c := lease.New(pool)
	rnd := rand.New(rand.NewSource(seed))
	inspect := func() (lease.State, error) {
		sent := e.rec.Now()
		st, err := c.Inspect(ctx, key)
		if err == nil {
			e.rec.Observe(key, party, "inspect", st.Epoch, sent, e.rec.Now())
		}
		return st, err
	}
	for sleep(ctx, between(rnd, probeEvery/2, probeEvery*3/2)) {
		// A registration, as every listener makes: it must not wait for
		// another role's transaction (check 8, which sees it waiting).
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := pool.Exec(lctx, `SELECT lease.listen($1)`, key); err == nil {
			e.rec.Count("probes: listens", 1)
		}
		cancel()
		before, err := inspect()
		if err != nil || before.Held {
			if err == nil {
				e.rec.Count("probes: key held", 1)
			}
			continue
		}
		hostileBefore, listens0 := e.reg.activeOn(key), e.reg.listensOn(key)
		sent := e.rec.Now()
		g, ok, err := c.Acquire(ctx, key, probeOwner, honestTTL)
		if err != nil {
			continue
		}
		if !ok {
			hostileDuring, listens1 := e.reg.activeOn(key), e.reg.listensOn(key)
			after, err := inspect()
			if err == nil && !after.Held && after.Epoch == before.Epoch && onlyListens(hostileBefore, hostileDuring, listens0, listens1) {
				e.rec.Count("probes: denied beside another role's listen (documented limit)", 1)
			} else if err == nil && !after.Held && after.Epoch == before.Epoch {
				e.rec.Violate(CheckFreeKey, "%s read free at epoch %d (before and after), yet the wait-0 acquire sent at %.3fs was denied; other roles' calls on it: %s",
					key, before.Epoch, sent.Seconds(), describeCalls(hostileBefore, hostileDuring))
			}
			e.rec.Count("probes: denied", 1)
			continue
		}
		e.rec.Count("probes: granted", 1)
		start := e.rec.Now()
		e.rec.Observe(key, party, "acquire", g.Epoch, sent, start)
		t, err := c.Begin(g, 0, nil)
		if err != nil {
			return err
		}
		tctx, cancel := t.Context(context.Background())
		e.termOf(tctx, key, party, roleProbe, start, e.rec.Now())
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), honestTTL)
		if err := t.Release(rctx); err == nil {
			e.judgeRelease(rctx, key, g.Epoch, roleProbe, party)
		}
		rcancel()
		cancel()
	}
	return nil
}

// describeCalls joins two lists of hostile calls, or says there were none.
func describeCalls(a, b []string) string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(a, b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return "none seen"
	}
	return fmt.Sprint(out)
}
