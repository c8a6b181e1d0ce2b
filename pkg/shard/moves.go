package shard

import (
	"context"
	"errors"
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

// take acquires the shards (wait 0) in one statement, or takes the grants
// a handover gave this replica (an acquire answers the caller's own
// grant), and begins their terms. A shard another owner took meanwhile is
// left to the next round.
func (r *Sharder) take(ctx context.Context, shards []int) error {
	var errs []error
	for len(shards) > 0 {
		n := min(len(shards), lease.MaxBatch)
		keys := make([]string, n)
		for i, s := range shards[:n] {
			keys[i] = Key(r.cfg.Controller, s)
		}
		grants, denied, err := r.c.AcquireMany(ctx, keys, r.owner, r.cfg.TTL)
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
			t, err := r.c.Begin(grants[i], r.cfg.Margin, nil)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			r.mu.Lock()
			r.owned[s] = newOwned(s, t)
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

// leave ends every shard's term (cancelling its work), lists the shard
// keys, then releases the member key, the grants handed over to it and
// every shard whose work has ended in one statement, and
// each other shard as soon as its work ends: a shard's grant moves only
// after its work, and a slow piece of work holds back its shard alone.
// A release hands the key to its registered runner-up in the same
// transaction. Then leave announces the change and withdraws its
// candidacies.
func (r *Sharder) leave(stopped time.Time) {
	r.mu.Lock()
	var ending []*owned
	for _, o := range r.owned {
		if !o.stopping {
			r.endLocked(o, ErrRebalanced)
			ending = append(ending, o)
		}
	}
	m := r.member
	untaken := map[int]lease.Token{} // grants handed over to this process, never taken
	for s, t := range r.handed {
		if r.owned[s] == nil {
			untaken[s] = t
		}
	}
	r.handed = map[int]lease.Token{}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.TTL)
	defer cancel()
	start := time.Now()
	// A handover may have granted this process shards no round has listed
	// yet: they go in the first statement too, not in the sweep at the end.
	shardKeys := make([]string, r.cfg.Shards)
	for s := range shardKeys {
		shardKeys[s] = Key(r.cfg.Controller, s)
	}
	if states, err := r.c.List(ctx, shardKeys...); err == nil {
		r.mu.Lock()
		for _, st := range states {
			if s, ok := parseShard(r.cfg.Controller, st.Key, r.cfg.Shards); ok && st.Held && st.Owner == r.owner && r.owned[s] == nil {
				untaken[s] = lease.Token{Key: st.Key, Owner: st.Owner, Epoch: st.Epoch}
			}
		}
		r.mu.Unlock()
	}
	var ts []lease.Token
	for _, t := range untaken {
		ts = append(ts, t)
	}
	if m != nil {
		m.End(lease.ErrReleased)
		ts = append(ts, m.Grant().Token)
	}
	// The first statement: the member key, the grants never taken and every
	// shard with no work running. Then each shard as its work ends,
	// those that end while a statement runs together in the next one.
	var busy []*owned
	for _, o := range ending {
		select {
		case <-o.drained:
			ts = append(ts, o.term.Grant().Token)
		default:
			busy = append(busy, o)
		}
	}
	ready := make(chan *owned, len(busy))
	for _, o := range busy {
		go func() { <-o.drained; ready <- o }()
	}
	var worked time.Duration
	statements := 0
	for pending := len(busy); len(ts) > 0 || pending > 0; {
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
		if pending == 0 && worked == 0 {
			worked = time.Since(start)
		}
		for len(ts) > 0 {
			n := min(len(ts), lease.MaxBatch)
			if _, err := r.c.ReleaseMany(ctx, ts[:n]); err != nil {
				r.cfg.Logger.Warn("shard: release", "controller", r.cfg.Controller, "keys", n, "err", err)
			}
			ts = ts[n:]
			statements++
		}
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
	// waited: for the statements of the round and the renewal running at the stop.
	var waited time.Duration
	if !stopped.IsZero() {
		waited = start.Sub(stopped)
	}
	r.cfg.Logger.Info("shard: left", "controller", r.cfg.Controller, "identity", r.cfg.Identity,
		"shards", len(ending), "waited", waited, "work_ended", worked, "released", released,
		"statements", statements, "announced", time.Since(start))
	var keys []string
	for s := range r.cands {
		keys = append(keys, Key(r.cfg.Controller, s))
	}
	_ = handover.WithdrawMany(ctx, r.c, keys, r.owner)
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
