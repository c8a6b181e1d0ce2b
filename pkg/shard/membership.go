package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/pglease/pg_lease/pkg/handover"
	"github.com/pglease/pg_lease/pkg/lease"
)

// candidacies registers this replica as the handover candidate of the
// shards in want (with their priorities) and withdraws the others: a
// release of such a shard by its owner grants it here in the same
// transaction, so the shard is never free. Registrations last a TTL and
// are refreshed all together when refresh is set (each renewal period);
// otherwise only the new and changed ones are registered.
func (r *Sharder) candidacies(ctx context.Context, want map[int]int32, refresh bool) error {
	changed := len(want) != len(r.cands)
	for s, p := range want {
		changed = changed || r.cands[s] != p
	}
	if !changed && !(refresh && len(want) > 0) {
		return nil
	}
	// A release hands a key over only under the releasing role's strategy:
	// priority, set once per key by this process for its role.
	var errs []error
	var unset []string
	for s := range want {
		if !r.strategy[s] {
			unset = append(unset, Key(r.cfg.Controller, s))
		}
	}
	slices.Sort(unset)
	if err := inBatches(len(unset), func(lo, hi int) error {
		return handover.SetStrategyMany(ctx, r.c, unset[lo:hi], handover.StrategyPriority)
	}); err != nil {
		// One key refused (pg_lease 0.4.0: another role's strategy stays;
		// or the role's bound): key by key.
		var set []string
		for _, k := range unset {
			if _, err := handover.SetStrategy(ctx, r.c, k, handover.StrategyPriority); err != nil && !errors.Is(err, lease.ErrPermission) {
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
	slices.Sort(gone)
	if err := inBatches(len(gone), func(lo, hi int) error {
		return handover.WithdrawMany(ctx, r.c, gone[lo:hi], r.owner)
	}); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for s := range r.cands {
		if _, ok := want[s]; !ok {
			delete(r.cands, s)
		}
	}
	// Registered: the new and changed candidacies, and all of them at a
	// refresh (a registration lasts a TTL).
	keys := make([]string, 0, len(want))
	prios := make([]int32, 0, len(want))
	for s, p := range want {
		if old, ok := r.cands[s]; refresh || !ok || old != p {
			keys = append(keys, Key(r.cfg.Controller, s))
			prios = append(prios, p)
		}
	}
	sortByKey(keys, prios)
	if err := inBatches(len(keys), func(lo, hi int) error {
		_, err := handover.RegisterMany(ctx, r.c, keys[lo:hi], prios[lo:hi], handover.Candidate{Owner: r.owner, Ready: true, TTL: r.cfg.TTL})
		return err
	}); err != nil {
		return errors.Join(append(errs, err)...)
	}
	r.cands = want
	if refresh {
		r.candsAt = r.c.Clock().Now()
	}
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
	r.keep.Add(t)
	r.rival = lease.State{}
	return 0, nil
}

// sortByKey sorts keys in byte order, prios along: replicas registering
// for overlapping keys then lock them in one order.
func sortByKey(keys []string, prios []int32) {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return keys[idx[a]] < keys[idx[b]] })
	k2, p2 := slices.Clone(keys), slices.Clone(prios)
	for i, j := range idx {
		keys[i], prios[i] = k2[j], p2[j]
	}
}

// inBatches calls f for [lo, hi) ranges of n items of at most
// lease.MaxBatch each, and returns the first error.
func inBatches(n int, f func(lo, hi int) error) error {
	for lo := 0; lo < n; lo += lease.MaxBatch {
		if err := f(lo, min(n, lo+lease.MaxBatch)); err != nil {
			return err
		}
	}
	return nil
}
