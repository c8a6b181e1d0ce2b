package shard

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// Run holds the member key and the assigned shard keys until ctx ends, then
// stops every shard's work, releases the shards and the member key, and
// returns nil. It returns ErrIdentityTaken, holding nothing, when another
// live process holds this replica's member key.
func (r *Sharder) Run(ctx context.Context) error {
	clk := r.c.Clock()
	keys := []string{changedKey(r.cfg.Controller)}
	for s := range r.cfg.Shards {
		keys = append(keys, Key(r.cfg.Controller, s))
	}
	changes := listen.Subscribe(ctx, r.cfg.Waiter, clk, keys...)
	defer changes.Close()
	// A statement running when ctx ends runs to its end (a TTL at most): a
	// connection cut mid-statement would leave the releases a new one, and
	// the server finishes the statement anyway. The loops stop after it.
	sctx, cancelStmts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStmts()
	stopGrace := context.AfterFunc(ctx, func() { clk.AfterFunc(r.cfg.TTL, cancelStmts) })
	defer stopGrace()
	rctx, stopRenewing := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() { defer close(renewing); r.renewLoop(rctx, sctx) }()
	defer func() { stopRenewing(); <-renewing }()
	stopped := make(chan time.Time, 1) // when ctx ended: shard: left says what the stop cost
	context.AfterFunc(ctx, func() { stopped <- clk.Now() })
	for {
		next, err := r.round(ctx, sctx)
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("shard: refusing to run", "controller", r.cfg.Controller,
				"identity", r.cfg.Identity, "err", err)
			stopRenewing()
			<-renewing
			r.leave(time.Time{})
			return err
		}
		if _, err := changes.Wait(ctx, clk.Now().Add(next), r.kick); err != nil {
			<-renewing
			if errors.Is(context.Cause(ctx), errCrash) {
				return nil // tests: a replica that stops renewing, as a crashed one
			}
			r.leave(<-stopped)
			return nil
		}
	}
}

// renewLoop renews the member key and every live shard key in one
// statement (lease.renew_many), on sctx, each RenewEvery until stop ends.
// A failed renewal of the member key wakes the loop, which acquires it
// again.
func (r *Sharder) renewLoop(stop, sctx context.Context) {
	clk := r.c.Clock()
	for {
		t := clk.NewTimer(r.cfg.RenewEvery)
		select {
		case <-stop.Done():
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
		errs := r.c.RenewTerms(sctx, terms)
		for i, err := range errs {
			if err != nil && stop.Err() == nil {
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
// handover candidacies. Its statements run on ctx; once stop ends, it
// returns between two of them. It returns when to run again. Renewals run
// in renewLoop: a slow round never delays them.
func (r *Sharder) round(stop, ctx context.Context) (time.Duration, error) {
	clk := r.c.Clock()
	warn := func(msg string, args ...any) {
		if stop.Err() == nil { // once stopping, the errors are the cancellation's
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
	if stop.Err() != nil {
		return next, nil
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
		if stop.Err() != nil {
			return next, nil
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
		if stop.Err() != nil {
			return next, nil // leave releases the member key and announces that
		}
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
	lapsing := map[int]time.Time{} // shard -> when its holder's grant lapses (no member holds it)
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
					lapsing[s] = st.ExpiresLocal()
				default:
					lapsing[s] = st.ExpiresLocal()
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
	if stop.Err() != nil {
		return next, nil // leave releases the grants handed to this process
	}

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
	// Grants of a crashed or departed holder that lapse within a Poll are
	// taken as they lapse, before this round's other statements: a crashed
	// replica's shards lapse at several instants, and a round per instant
	// would add a list and the candidacies between two takes.
	for stop.Err() == nil {
		var first time.Time
		for _, at := range lapsing {
			if first.IsZero() || at.Before(first) {
				first = at
			}
		}
		if first.IsZero() || first.Sub(clk.Now()) > r.cfg.Poll {
			break
		}
		if d := first.Sub(clk.Now()); d > 0 {
			t := clk.NewTimer(d)
			select {
			case <-t.C():
			case <-stop.Done():
				t.Stop()
				continue
			}
		}
		now := clk.Now()
		var due []int
		for s, at := range lapsing {
			if !at.After(now) {
				due = append(due, s)
				delete(lapsing, s)
			}
		}
		slices.Sort(due)
		if err := r.take(ctx, due); err != nil {
			warn("shard: acquire", "controller", r.cfg.Controller, "shards", len(due), "err", err)
			next = min(next, r.cfg.Poll)
		}
		for _, s := range due {
			if r.Owns(s) {
				delete(cands, s)
			}
		}
		r.cfg.Logger.Info("shard: took", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
			"shards", len(due), "lapsed", clk.Since(first), "took", clk.Since(now))
	}
	for _, at := range lapsing {
		next = min(next, max(at.Sub(clk.Now()), time.Millisecond))
	}
	if stop.Err() != nil {
		return next, nil // leave releases the strays and withdraws
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
