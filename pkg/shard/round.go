package shard

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/listen"
)

// round is one step of the loop: the takeovers of the last round that are
// due, the members and shards as the database has them, the member key,
// then the plan (decide) applied: the shards to give up and to take, and
// the handover candidacies. Its statements run on ctx; once stop ends, it
// returns between two of them. It returns when to run again (an instant on
// the client's clock). Renewals run in the keep-alive (r.keep): a slow
// round never delays them.
func (r *Sharder) round(stop, ctx context.Context) (time.Time, error) {
	clk := r.c.Clock()
	warn := r.warner(stop)
	r.stopEnded()
	r.takeOver(ctx, stop)
	r.mu.Lock()
	overs := r.overs
	r.mu.Unlock()
	states, err := r.c.List(ctx)
	if err != nil {
		warn("shard: list", "controller", r.cfg.Controller, "err", err)
		return clk.Now().Add(min(r.cfg.RenewEvery, r.cfg.Poll)), nil
	}
	listed := clk.Now()
	if stop.Err() != nil {
		return listed.Add(r.cfg.RenewEvery), nil
	}
	sn := readSnapshot(r.cfg.Controller, r.cfg.Shards, r.cfg.Identity, r.owner, states, listed)
	r.mu.Lock()
	joined := r.member != nil && r.member.Err() == nil
	r.mu.Unlock()
	if !joined {
		r.setPending(nil)
		// The member key: acquired at the first round, and again when its
		// term ended. The others learn of it from announce, after the
		// candidacies.
		if wait, done, err := r.join(stop, ctx, sn); done {
			return clk.Now().Add(wait), err
		}
	}
	sn = sn.withSelf(r.cfg.Identity, r.owner)
	r.moves.Lock()
	r.mu.Lock()
	stale := r.overs != overs
	r.mu.Unlock()
	if stale {
		// A takeover or a handover's take ran since the list: a plan from
		// it would give up what it took (the list shows the former holder
		// live, or holding it). List again.
		r.moves.Unlock()
		return clk.Now(), nil
	}
	p := r.plan(sn, listed)
	wake := p.wake(listed)
	r.setPending(p.takeovers)
	if stop.Err() != nil {
		r.moves.Unlock()
		return wake, nil // leave releases the grants handed to this process
	}
	if !r.takeNow(ctx, stop, &p, listed) {
		wake = earliest(wake, clk.Now().Add(r.cfg.Poll))
	}
	if stop.Err() == nil {
		r.releaseStray(ctx, stop, p.stray)
	}
	r.moves.Unlock()
	if stop.Err() != nil {
		return wake, nil // leave releases the strays and withdraws
	}
	if err := r.candidacies(ctx, p.cands, clk.Since(r.candsAt) >= r.cfg.RenewEvery); err != nil {
		warn("shard: handover candidacies", "controller", r.cfg.Controller, "err", err)
	}
	r.mu.Lock()
	r.metrics.owned.Set(float64(len(r.owned)))
	r.mu.Unlock()
	if soon := clk.Now().Add(time.Millisecond); wake.Before(soon) {
		wake = soon
	}
	return wake, nil
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// warner logs a warning unless stop ended: once stopping, the errors are
// the cancellation's.
func (r *Sharder) warner(stop context.Context) func(msg string, args ...any) {
	return func(msg string, args ...any) {
		if stop.Err() == nil {
			r.cfg.Logger.Warn(msg, args...)
		}
	}
}

// stopEnded stops the shards whose term ended (lost, or its deadline
// passed) and releases them after their work.
func (r *Sharder) stopEnded() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ended []*owned
	for _, o := range r.owned {
		if !o.stopping && o.term.Err() != nil {
			r.endLocked(o, o.term.Err())
			ended = append(ended, o)
		}
	}
	r.releaseAfterWork(ended)
}

// join registers the candidacies of a joining replica (the shards it will
// win, so that their owners' releases hand them over), acquires the member
// key and announces it. done reports that the round ends here, with wait
// and err as its result.
func (r *Sharder) join(stop, ctx context.Context, sn snapshot) (wait time.Duration, done bool, err error) {
	warn := r.warner(stop)
	next := min(r.cfg.RenewEvery, max(sn.memberLapse, 0))
	if next == 0 {
		next = r.cfg.RenewEvery
	}
	cands := joinCandidacies(r.cfg.Shards, sn, r.cfg.Identity, r.owner)
	if err := r.candidacies(ctx, cands, true); err != nil {
		warn("shard: handover candidacies", "controller", r.cfg.Controller, "err", err)
	}
	if stop.Err() != nil {
		return next, true, nil
	}
	wait, err = r.ensureMember(ctx)
	if err != nil {
		if err := r.candidacies(ctx, nil, false); err != nil {
			warn("shard: handover candidacies", "controller", r.cfg.Controller, "err", err)
		}
		if errors.Is(err, ErrIdentityTaken) {
			return 0, true, err
		}
		warn("shard: member key", "controller", r.cfg.Controller, "err", err)
		return max(min(next, wait), time.Millisecond), true, nil
	}
	if stop.Err() != nil {
		return next, true, nil // leave releases the member key and announces that
	}
	r.announce(ctx)
	return 0, false, nil
}

// plan decides the round from sn and applies its local part under mu: the
// view, the metrics, the shards given up (released after their work) and
// the grants handed over to this process.
func (r *Sharder) plan(sn snapshot, listed time.Time) plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	own := make(map[int]bool, len(r.owned))
	for s, o := range r.owned {
		own[s] = !o.stopping
	}
	p := decide(planInput{n: r.cfg.Shards, identity: r.cfg.Identity, owner: r.owner, snap: sn, own: own,
		listed: listed, next: r.cfg.RenewEvery, poll: r.cfg.Poll, ttl: r.cfg.TTL, waiter: r.cfg.Waiter != nil})
	r.members, r.assign = sn.members, p.assign
	r.noteUnowned(sn, listed)
	var moving []*owned
	for _, s := range p.give {
		r.endLocked(r.owned[s], ErrRebalanced)
		moving = append(moving, r.owned[s])
	}
	for s, t := range p.handed {
		r.handed[s] = t
	}
	r.releaseAfterWork(moving)
	return p
}

// noteUnowned updates the unowned metrics: a shard nobody held at two lists
// in a row was unowned for the time between them, as far as this replica
// can tell.
func (r *Sharder) noteUnowned(sn snapshot, listed time.Time) {
	var unowned int
	for s, st := range sn.shards {
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
	r.metrics.members.Set(float64(len(sn.members)))
}

// takeNow takes the plan's shards in one statement: after a leave or a
// crash, a replica may take many at once. It reports whether every take
// succeeded.
func (r *Sharder) takeNow(ctx, stop context.Context, p *plan, listed time.Time) bool {
	clk := r.c.Clock()
	takeAt := clk.Now()
	err := r.take(ctx, p.take, time.Time{})
	if err != nil {
		r.warner(stop)("shard: acquire", "controller", r.cfg.Controller, "shards", len(p.take), "err", err)
	}
	if len(p.take) > 0 {
		r.cfg.Logger.Info("shard: took", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
			"shards", len(p.take), "list_age", takeAt.Sub(listed), "took", clk.Since(takeAt))
	}
	return err == nil
}

// setPending replaces the takeovers to send with those of a round's plan.
func (r *Sharder) setPending(ts []takeover) {
	r.mu.Lock()
	r.pending = ts
	r.mu.Unlock()
	select {
	case r.replan <- struct{}{}:
	default:
	}
}

// sendTakeovers sends, until stop ends, each takeover of the last plan at
// its instant (takeOver), beside the rounds: a round's statements running
// then (a list, the handover registrations) do not delay it.
func (r *Sharder) sendTakeovers(stop, ctx context.Context) {
	clk := r.c.Clock()
	for {
		r.mu.Lock()
		var at time.Time
		for _, to := range r.pending {
			if at.IsZero() || to.at.Before(at) {
				at = to.at
			}
		}
		r.mu.Unlock()
		var fire <-chan time.Time
		var t clock.Timer
		if !at.IsZero() {
			t = clk.NewTimer(at.Sub(clk.Now()))
			fire = t.C()
		}
		select {
		case <-stop.Done():
		case <-r.replan:
		case <-fire:
			r.takeOver(ctx, stop)
		}
		if t != nil {
			t.Stop()
		}
		if stop.Err() != nil {
			return
		}
	}
}

// takeOver takes, in one statement, the shards of the last plan's
// takeovers whose instant passed: a crashed replica's shards are taken at
// the lapse of its keys, one statement per surviving replica with no read
// before it, sent before the lapse and waiting on the server for it. A
// shard still held then (its holder renewed it) is refused, and the next
// round's plan sees it.
func (r *Sharder) takeOver(ctx, stop context.Context) {
	clk := r.c.Clock()
	now := clk.Now()
	r.mu.Lock()
	shards, first, expires, left := due(r.pending, now)
	r.pending = left
	r.mu.Unlock()
	if len(shards) == 0 || stop.Err() != nil {
		return
	}
	r.moves.Lock()
	defer r.moves.Unlock()
	r.mu.Lock()
	joined := r.member != nil && r.member.Err() == nil
	// A shard tracked here (acting under it, or giving it up) is no takeover.
	shards = slices.DeleteFunc(shards, func(s int) bool { return r.owned[s] != nil })
	r.mu.Unlock()
	if !joined || len(shards) == 0 {
		return
	}
	err := r.take(ctx, shards, expires)
	r.mu.Lock()
	r.overs++
	r.mu.Unlock()
	if err != nil {
		r.warner(stop)("shard: acquire", "controller", r.cfg.Controller, "shards", len(shards), "err", err)
	}
	r.cfg.Logger.Info("shard: took over", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
		"shards", len(shards), "late", now.Sub(first), "took", clk.Since(now))
}

// takeHandedOver takes, until ctx ends, the grants that a release hands to
// this process, as the notification of each handover arrives: one
// statement (lease.Client.RenewTokens of the owner and epoch each
// notification names), with no list before it and whatever the rounds are
// doing. The handovers notified while that statement runs (the rest of one
// release's, as a rule) are taken beside it, in one more statement at
// most, not after it (takeBatch); those notified later are taken next, and
// only then are all this process's keys renewed at once (align): a batch
// waits for no renewal. Any role may NOTIFY: a notification is only a
// sign, and the renewal takes only a grant the server shows held by this
// process at that epoch (a forged one takes nothing); a shard taken that
// is assigned elsewhere is given up by the next round. Batches follow one
// another only while each takes a grant (real handovers, at most one per
// shard): a batch that takes none lets the rounds run before the next, so
// a flood of forged notifications never holds them back.
func (r *Sharder) takeHandedOver(ctx, stmts context.Context, handovers *listen.Changes) {
	var deferred []listen.Event // notified for a shard a statement was taking
	for {
		events := deferred
		deferred = nil
		if len(events) == 0 {
			wk, err := handovers.Wait(ctx, time.Time{}, nil)
			if err != nil {
				return
			}
			events = wk.Events
		} else if ctx.Err() != nil {
			return
		}
		// Decided under moves: a round that took these grants meanwhile
		// leaves nothing to take again.
		r.moves.Lock()
		began := false
		for len(events) > 0 && ctx.Err() == nil {
			ok, rest := r.takeBatch(ctx, stmts, handovers, events)
			began = began || ok
			if !ok {
				// Nothing taken: forged notifications, maybe a flood of
				// them. What is queued waits for the next Wait, after
				// moves is given up, so the rounds are not held back;
				// what was deferred goes first then.
				deferred = rest
				break
			}
			events = append(rest, handovers.Queued().Events...)
		}
		if began {
			r.align(stmts)
			// A round that listed before these terms began lists again.
			r.mu.Lock()
			r.overs++
			r.mu.Unlock()
		}
		r.moves.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

// takeBatch takes the handovers events name in one statement and, when
// more are notified while it runs, those in one more statement beside it
// (the notifications of one release reach the Waiter one after another).
// It reports whether it began a term, and returns the notifications of
// shards the first statement was taking that arrived meanwhile: they are
// decided after it (a later epoch of the same shard).
func (r *Sharder) takeBatch(ctx, stmts context.Context, handovers *listen.Changes, events []listen.Event) (bool, []listen.Event) {
	clk := r.c.Clock()
	tracked := r.trackedEpochs()
	shards, tokens := handedTo(r.cfg.Controller, r.cfg.Shards, r.owner, events, tracked)
	if len(shards) == 0 {
		return false, nil
	}
	take := func(shards []int, tokens []lease.Token, received time.Time) bool {
		at := clk.Now()
		ok, err := r.takeHanded(stmts, shards, tokens)
		if err != nil {
			r.warner(ctx)("shard: take handed over", "controller", r.cfg.Controller, "shards", len(shards), "err", err)
		}
		r.cfg.Logger.Info("shard: took handed over", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
			"shards", len(shards), "notified", at.Sub(received), "took", clk.Since(at))
		return ok
	}
	var first bool
	firstDone := make(chan struct{})
	go func() { defer close(firstDone); first = take(shards, tokens, events[0].Received) }()
	second := false
	var rest []listen.Event
	if more, err := handovers.Wait(ctx, time.Time{}, firstDone); err == nil && len(more.Events) > 0 {
		for _, s := range shards {
			tracked[s] = math.MaxInt64 // being taken
		}
		for _, ev := range more.Events {
			if s, ok := parseShard(r.cfg.Controller, ev.Key, r.cfg.Shards); ok && slices.Contains(shards, s) {
				rest = append(rest, ev)
			}
		}
		if s2, t2 := handedTo(r.cfg.Controller, r.cfg.Shards, r.owner, more.Events, tracked); len(s2) > 0 {
			second = take(s2, t2, more.Events[0].Received)
		}
	}
	<-firstDone
	return first || second, rest
}

// trackedEpochs maps each shard this replica tracks to the epoch up to
// which a handover of it is not taken: a shard acting here whatever the
// epoch (math.MaxInt64); one being given up (or whose term ended) up to
// its tracked epoch: that grant is released only once its work ended, and
// a forged notification naming it would begin a second term beside that
// work.
func (r *Sharder) trackedEpochs() map[int]int64 {
	tracked := map[int]int64{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for s, o := range r.owned {
		tracked[s] = o.term.Grant().Epoch
		if !o.stopping && o.term.Err() == nil {
			tracked[s] = math.MaxInt64
		}
	}
	return tracked
}

// takeHanded renews the grants tokens name (those of shards), in one
// statement, and begins a term for each the server renewed; it reports
// whether it began one. The caller then renews every key of this process
// at once (align).
func (r *Sharder) takeHanded(ctx context.Context, shards []int, tokens []lease.Token) (bool, error) {
	var errs []error
	began := false
	for len(tokens) > 0 {
		n := min(len(tokens), lease.MaxBatch)
		grants, denied, err := r.c.RenewTokens(ctx, tokens[:n], r.cfg.TTL)
		if err != nil {
			errs = append(errs, err)
			break
		}
		for i, s := range shards[:n] {
			if denied[i] != nil {
				continue // not this process's grant at that epoch (any more)
			}
			ok, err := r.begin(s, grants[i])
			began = began || ok
			if err != nil {
				errs = append(errs, err)
			}
		}
		shards, tokens = shards[n:], tokens[n:]
	}
	return began, errors.Join(errs...)
}

// handedTo returns, in order, the shards that events say a release handed
// to owner, and the token of each handed grant (the latest notified), but
// for a shard this replica tracks at an epoch not below the notified one
// (tracked: math.MaxInt64 for a shard it acts under).
func handedTo(controller string, n int, owner string, events []listen.Event, tracked map[int]int64) ([]int, []lease.Token) {
	latest := map[int]lease.Token{}
	for _, ev := range events {
		s, ok := parseShard(controller, ev.Key, n)
		// An epoch below 1 names no grant (a forged notification): the
		// server would refuse the whole batch for it.
		if e, seen := tracked[s]; !ok || ev.Type != listen.EventHandover || ev.Owner != owner || ev.Epoch < 1 || seen && ev.Epoch <= e {
			continue
		}
		if t, seen := latest[s]; !seen || ev.Epoch > t.Epoch {
			latest[s] = lease.Token{Key: ev.Key, Owner: ev.Owner, Epoch: ev.Epoch}
		}
	}
	shards := slices.Sorted(maps.Keys(latest))
	tokens := make([]lease.Token, len(shards))
	for i, s := range shards {
		tokens[i] = latest[s]
	}
	return shards, tokens
}

// releaseStray releases, in one statement, grants handed to this process
// for shards assigned elsewhere: the release hands them on.
func (r *Sharder) releaseStray(ctx, stop context.Context, stray []lease.Token) {
	warn := r.warner(stop)
	errs, err := r.c.ReleaseMany(ctx, stray)
	if err != nil {
		warn("shard: release", "controller", r.cfg.Controller, "shards", len(stray), "err", err)
		return
	}
	for i, err := range errs {
		if err != nil && !errors.Is(err, lease.ErrLost) {
			warn("shard: release", "key", stray[i].Key, "err", err)
		}
	}
}
