package shard

import (
	"context"
	"sort"

	"github.com/pglease/pg_lease/pkg/lease"
)

// View is a controller's shards as the database has them: what `pglease
// shards` prints.
type View struct {
	Controller string
	// Members are the live members (their member key held), sorted.
	Members []string
	// Shards holds one entry per shard 0..N-1.
	Shards []ShardState
}

// ShardState is one shard's key and the member Balance names for it.
type ShardState struct {
	Shard int
	// State of the shard's key (Exists false: never acquired).
	State lease.State
	// Assigned is the member that should own the shard ("" without members).
	Assigned string
	// Member is the live member whose process holds the key: "" when the
	// key is free or its holder is no live member (it left or crashed).
	Member string
}

// Owned reports whether the shard's key is held.
func (s ShardState) Owned() bool { return s.State.Held }

// Misplaced reports whether the shard is held by another member than the
// one assigned: a rebalance in progress, or a holder that is not a member.
func (s ShardState) Misplaced() bool { return s.State.Held && s.Member != s.Assigned }

// Read reads the controller's members and shard keys in one lease.list.
// n is the number of shards; 0 infers it from the highest shard key seen.
func Read(ctx context.Context, c *lease.Client, controller string, n int) (View, error) {
	states, err := c.List(ctx)
	if err != nil {
		return View{}, err
	}
	v := View{Controller: controller}
	byShard := map[int]lease.State{}
	byOwner := map[string]string{} // holder of a member key -> member
	for _, st := range states {
		if m, ok := memberOf(controller, st.Key); ok && st.Held {
			v.Members = append(v.Members, m)
			byOwner[st.Owner] = m
			continue
		}
		if s, ok := parseShard(controller, st.Key, MaxShards); ok {
			byShard[s] = st
			if n == 0 || s >= n {
				n = max(n, s+1)
			}
		}
	}
	sort.Strings(v.Members)
	holders := make([]string, n)
	for s, st := range byShard {
		if st.Held && s < n {
			holders[s] = byOwner[st.Owner]
		}
	}
	assign := Balance(n, v.Members, holders)
	for s := range n {
		st, ok := byShard[s]
		if !ok {
			st = lease.State{Key: Key(controller, s)}
		}
		ss := ShardState{Shard: s, State: st}
		if st.Held {
			ss.Member = byOwner[st.Owner]
		}
		if assign != nil {
			ss.Assigned = assign[s]
		}
		v.Shards = append(v.Shards, ss)
	}
	return v, nil
}
