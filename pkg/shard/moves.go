package shard

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// announce wakes the other replicas watching the controller's changed key:
// an acquire and a release of it, each notified.
func (r *Sharder) announce(ctx context.Context) {
	g, ok, err := r.c.Acquire(ctx, changedKey(r.cfg.Controller), r.owner, time.Second)
	if err == nil && ok {
		_ = r.c.Release(ctx, g.Token)
	}
}

// take acquires the shards (wait 0) in one statement
// (lease.Client.AcquireManyAt: asked at at, on the server's clock; zero:
// at once), or takes the grants a handover gave this replica (an acquire
// answers the caller's own grant), and begins their terms. A shard another owner took meanwhile is
// left to the next round. Once it began a term, it renews every key of
// this process (align).
func (r *Sharder) take(ctx context.Context, shards []int, at time.Time) error {
	var errs []error
	began := false
	defer func() {
		if began {
			r.align(ctx)
		}
	}()
	for len(shards) > 0 {
		n := min(len(shards), lease.MaxBatch)
		keys := make([]string, n)
		for i, s := range shards[:n] {
			keys[i] = Key(r.cfg.Controller, s)
		}
		grants, denied, err := r.c.AcquireManyAt(ctx, at, keys, r.owner, r.cfg.TTL)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for i, s := range shards[:n] {
			if denied[i] != nil || grants[i].Epoch == 0 {
				if denied[i] != nil {
					errs = append(errs, denied[i])
				}
				continue
			}
			ok, err := r.begin(s, grants[i])
			began = began || ok
			if err != nil {
				errs = append(errs, err)
			}
		}
		shards = shards[n:]
	}
	return errors.Join(errs...)
}

// begin begins a term for shard s under g, unless this replica acts under
// that grant already (a handover's notification and a round both took it)
// or is leaving (a statement running at the stop took g: the leave
// releases it, and no work starts under it), and reports whether it began
// one.
func (r *Sharder) begin(s int, g lease.Grant) (bool, error) {
	r.mu.Lock()
	if o := r.owned[s]; r.leaving || o != nil && !o.stopping && o.term.Err() == nil && o.term.Grant().Epoch == g.Epoch {
		r.mu.Unlock()
		return false, nil
	}
	t, err := r.c.Begin(g, r.cfg.Margin, nil)
	if err != nil {
		r.mu.Unlock()
		return false, err
	}
	r.owned[s] = newOwned(s, t)
	delete(r.handed, s)
	r.mu.Unlock()
	r.keep.Add(t)
	r.metrics.rebalances.WithLabelValues("acquired").Inc()
	if r.cfg.OnAcquired != nil {
		r.cfg.OnAcquired(s)
	}
	return true, nil
}

// align renews the member key and every shard key of this process in one
// statement (lease.Client.RenewTerms), so that they all expire at one
// instant: a grant just taken would otherwise lapse apart from the others
// until the keep-alive's next round, and were this replica to crash then,
// the others would take its shards at two instants. Its failures are the
// keep-alive's to report.
func (r *Sharder) align(ctx context.Context) {
	ts := slices.DeleteFunc(r.keep.Terms(), func(t *lease.Term) bool { return t.Grant().TTL != r.cfg.TTL })
	for len(ts) > 0 {
		n := min(len(ts), lease.MaxBatch)
		for i, err := range r.c.RenewTerms(ctx, ts[:n]) {
			r.renewed(ts[i], 0, err)
		}
		ts = ts[n:]
	}
}

// endLocked ends o's term: its contexts are cancelled with cause.
func (r *Sharder) endLocked(o *owned, cause error) {
	o.stopping = true
	if o.inflight == 0 {
		close(o.drained)
	}
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
			<-o.drained
			ts[i] = o.term.Grant().Token
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
		defer cancel()
		for len(ts) > 0 {
			n := min(len(ts), lease.MaxBatch)
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

// handedOff is what a leave's hand-over did, for its log line.
type handedOff struct {
	stopped    time.Time // the stop, on the client's clock
	loopsEnded time.Time // the round, renewal and take running at the stop ended (zero: no stop)
	shards     int
	sent       time.Duration // from the stop to the first release sent
	worked     time.Duration // from the stop to the end of the last work
	first      time.Duration // the first release statement
	released   time.Duration // from the stop to the last release's return
	announced  time.Duration // from the stop to the announce's end
	statements int
}

// handOver is a leave's first part, begun at the stop beside whatever
// statement the round, the renewal or a take runs then (it waits for none
// of them): it ends every shard's term (cancelling its work; no term begins
// after it), then releases the member key, the grants handed over to this
// process and every shard in one statement (lease.Client.ReleaseMany) once
// their work ended, waiting a Poll at most for it: a shard whose work runs
// longer goes in a later statement as soon as it ends, so a slow piece of
// work holds back its shard alone. A release hands the key to its
// registered runner-up in the same transaction. No statement runs before
// the release: grants handed over that this process has not seen yet are
// found by a list beside it and released right after; the candidacies
// are withdrawn beside it too. Then it announces the change. What a statement running at the stop takes is released by
// finish.
func (r *Sharder) handOver(stopped time.Time) handedOff {
	clk := r.c.Clock()
	ending, ts := r.endAll()
	h := handedOff{stopped: stopped, shards: len(ending)}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
	defer cancel()
	// A handover may have granted this process shards no round has listed
	// nor notification brought: a list, run beside the first release and
	// not before it, finds them for a second statement at once (none, as a
	// rule), not for the sweep at the end.
	unlisted := make(chan []lease.Token, 1)
	have := slices.Clone(ts)
	go func() { unlisted <- r.handedUnlisted(ctx, have) }()
	// The candidacies end at the stop too, beside the release: a release
	// by another owner meanwhile hands its key to a live replica, not to
	// this one, which would hold it unworked until finish.
	withdrawn := make(chan struct{})
	go func() { defer close(withdrawn); r.withdrawAll(ctx) }()
	defer func() { <-withdrawn }()
	rel := r.releaseAsDone(ctx, ts, ending)
	if more := <-unlisted; len(more) > 0 {
		rel2 := r.releaseAsDone(ctx, more, nil)
		if rel2.worked.After(rel.worked) {
			rel.worked = rel2.worked
		}
		rel.statements += rel2.statements
	}
	since := func(t time.Time) time.Duration {
		if t.IsZero() {
			return 0
		}
		return t.Sub(stopped)
	}
	h.sent, h.worked, h.first, h.statements = since(rel.sent), since(rel.worked), rel.first, rel.statements
	h.released = clk.Since(stopped)
	r.mu.Lock()
	for _, o := range ending {
		if r.owned[o.s] == o {
			delete(r.owned, o.s)
		}
	}
	m := r.member
	r.mu.Unlock()
	if m != nil {
		r.announce(ctx)
	}
	h.announced = clk.Since(stopped)
	return h
}

// finish is a leave's second part, once the round, the renewal and the
// take running at the stop ended: it waits for the releases begun by
// earlier rounds, withdraws the candidacies, and releases what this
// process holds still: grants that a statement running at the stop took
// after the hand-over (no term began under them), and a member key a
// round acquired meanwhile (then it announces again).
func (r *Sharder) finish(h handedOff) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
	defer cancel()
	r.stops.Wait() // releases begun by earlier rounds
	var keys []string
	for s := range r.cands {
		keys = append(keys, Key(r.cfg.Controller, s))
	}
	_ = handover.WithdrawMany(ctx, r.c, keys, r.owner)
	r.cands = map[int]int32{}
	left, member := r.releaseLeftOver(ctx)
	if member {
		r.announce(ctx)
	}
	r.metrics.owned.Set(0)
	// waited: from the stop to the first release sent (the work's end);
	// in_flight: to the end of the statements running at the stop.
	var inFlight time.Duration
	if !h.loopsEnded.IsZero() {
		inFlight = max(h.loopsEnded.Sub(h.stopped), 0)
	}
	r.cfg.Logger.Info("shard: left", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
		"shards", h.shards, "waited", h.sent, "work_ended", h.worked, "release", h.first, "released", h.released,
		"statements", h.statements, "announced", h.announced, "in_flight", inFlight, "left_over", left)
}

// withdrawAll withdraws this process's candidacies for every shard (a
// key it is no candidate of costs an unlocked read): the round's own
// record of them (cands) is the round's, which may still run.
func (r *Sharder) withdrawAll(ctx context.Context) {
	keys := make([]string, r.cfg.Shards)
	for s := range keys {
		keys[s] = Key(r.cfg.Controller, s)
	}
	if err := inBatches(len(keys), func(lo, hi int) error {
		return handover.WithdrawMany(ctx, r.c, keys[lo:hi], r.owner)
	}); err != nil {
		r.cfg.Logger.Warn("shard: withdraw candidacies", "controller", r.cfg.Controller, "err", err)
	}
}

// endAll ends the term of every shard not ended yet and of the member key,
// so that no term begins from then on (begin), and returns the shards it ended and the tokens to release at once: the
// member key's and those of grants handed over to this process and never
// taken.
func (r *Sharder) endAll() (ending []*owned, ts []lease.Token) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leaving = true
	for _, o := range r.owned {
		if !o.stopping {
			r.endLocked(o, ErrRebalanced)
			ending = append(ending, o)
		}
	}
	for s, t := range r.handed {
		if r.owned[s] == nil {
			ts = append(ts, t)
		}
	}
	r.handed = map[int]lease.Token{}
	if r.member != nil {
		r.member.End(lease.ErrReleased)
		ts = append(ts, r.member.Grant().Token)
	}
	return ending, ts
}

// handedUnlisted lists the shard keys and returns the tokens of those this
// process holds without a term (it tracks no shard of that number) and
// that are not in have.
func (r *Sharder) handedUnlisted(ctx context.Context, have []lease.Token) []lease.Token {
	shardKeys := make([]string, r.cfg.Shards)
	for s := range shardKeys {
		shardKeys[s] = Key(r.cfg.Controller, s)
	}
	var states []lease.State
	if err := inBatches(len(shardKeys), func(lo, hi int) error {
		sts, err := r.c.List(ctx, shardKeys[lo:hi]...)
		states = append(states, sts...)
		return err
	}); err != nil {
		return nil
	}
	seen := map[string]bool{}
	for _, t := range have {
		seen[t.Key] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []lease.Token
	for _, st := range states {
		if s, ok := parseShard(r.cfg.Controller, st.Key, r.cfg.Shards); ok && st.Held && st.Owner == r.owner &&
			r.owned[s] == nil && !seen[st.Key] {
			out = append(out, lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch})
		}
	}
	return out
}

// releases is what releaseAsDone did: when the first statement was sent,
// how long it took, when the last work ended and how many statements ran.
type releases struct {
	sent, worked time.Time
	first        time.Duration
	statements   int
}

// releaseAsDone releases ts and each ending shard once its work ended: one
// statement for all when the work ends within a Poll, else those ended
// by then, and each other as it ends (those that end while a statement
// runs together in the next one).
func (r *Sharder) releaseAsDone(ctx context.Context, ts []lease.Token, ending []*owned) releases {
	clk := r.c.Clock()
	var out releases
	ready := make(chan *owned, len(ending))
	for _, o := range ending {
		go func() { <-o.drained; ready <- o }()
	}
	pending := len(ending)
	grace := clk.NewTimer(r.cfg.Poll)
	defer grace.Stop()
	for waiting := pending > 0; waiting; {
		select {
		case o := <-ready:
			ts, pending = append(ts, o.term.Grant().Token), pending-1
			waiting = pending > 0
		case <-grace.C():
			waiting = false
		}
	}
	for len(ts) > 0 || pending > 0 {
		if len(ts) == 0 {
			o := <-ready
			ts, pending = append(ts, o.term.Grant().Token), pending-1
		}
		for more := true; more; {
			select {
			case o := <-ready:
				ts, pending = append(ts, o.term.Grant().Token), pending-1
			default:
				more = false
			}
		}
		if pending == 0 && out.worked.IsZero() {
			out.worked = clk.Now()
		}
		for len(ts) > 0 {
			n := min(len(ts), lease.MaxBatch)
			at := clk.Now()
			if _, err := r.c.ReleaseMany(ctx, ts[:n]); err != nil {
				r.cfg.Logger.Warn("shard: release", "controller", r.cfg.Controller, "keys", n, "err", err)
			}
			if out.statements == 0 {
				out.sent, out.first = at, clk.Since(at)
			}
			ts = ts[n:]
			out.statements++
		}
	}
	return out
}

// releaseLeftOver releases the member key and the shard grants this
// process holds still: handed to it after it left (it stopped meanwhile,
// or was refused), or taken by a statement running at the stop. The
// release hands them on. It returns how many it released and whether the
// member key was one.
func (r *Sharder) releaseLeftOver(ctx context.Context) (n int, member bool) {
	states, err := r.c.List(ctx)
	if err != nil {
		return 0, false
	}
	var stray []lease.Token
	mk := MemberKey(r.cfg.Controller, r.cfg.Identity)
	for _, st := range states {
		if _, ok := parseShard(r.cfg.Controller, st.Key, r.cfg.Shards); (ok || st.Key == mk) && st.Held && st.Owner == r.owner {
			stray = append(stray, lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch})
			member = member || st.Key == mk
		}
	}
	_ = inBatches(len(stray), func(lo, hi int) error {
		_, err := r.c.ReleaseMany(ctx, stray[lo:hi])
		return err
	})
	return len(stray), member
}
