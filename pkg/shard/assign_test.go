package shard_test

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/pglease/pg_lease/pkg/shard"
)

func members(n int) []string {
	var ms []string
	for i := range n {
		ms = append(ms, fmt.Sprintf("replica-%d", i))
	}
	return ms
}

func count(owners []string) map[string]int {
	c := map[string]int{}
	for _, o := range owners {
		c[o]++
	}
	return c
}

// spread is the largest difference in shard counts between members.
func spread(owners []string, ms []string) int {
	c := count(owners)
	lo, hi := len(owners), 0
	for _, m := range ms {
		lo, hi = min(lo, c[m]), max(hi, c[m])
	}
	return hi - lo
}

// minMoves is the fewest shards that must change holder to reach any
// balanced map of n shards over ms from holders: n less the most shards
// that can stay, with the q+1 caps given to the members holding most.
func minMoves(n int, ms, holders []string) int {
	c := count(holders)
	var held []int
	for _, m := range ms {
		held = append(held, c[m])
	}
	sort.Sort(sort.Reverse(sort.IntSlice(held)))
	q, r := n/len(ms), n%len(ms)
	stay := 0
	for k, h := range held {
		cp := q
		if k < r {
			cp++
		}
		stay += min(h, cp)
	}
	return n - stay
}

func moved(before, after []string) int {
	k := 0
	for s := range before {
		if before[s] != after[s] {
			k++
		}
	}
	return k
}

// TestAssignBalance: for 1 to 1,024 shards over 1 to 10 members, shard
// counts differ by at most one, every shard has a member, and the answer
// does not depend on the order in which members are given.
func TestAssignBalance(t *testing.T) {
	for _, n := range []int{1, 3, 7, 64, 100, 1024} {
		for r := 1; r <= 10; r++ {
			ms := members(r)
			owners := shard.Assign(n, ms)
			rev := slices.Clone(ms)
			slices.Reverse(rev)
			if !slices.Equal(shard.Assign(n, rev), owners) {
				t.Errorf("%d shards, %d members: the assignment depends on the members' order", n, r)
			}
			if d := spread(owners, ms); d > 1 {
				t.Errorf("%d shards, %d members: counts %v differ by %d", n, r, count(owners), d)
			}
			for s, o := range owners {
				if !slices.Contains(ms, o) {
					t.Fatalf("%d shards, %d members: shard %d goes to %q", n, r, s, o)
				}
			}
		}
	}
	if shard.Assign(64, nil) != nil {
		t.Error("no member: want no assignment")
	}
}

// TestBalanceMoves: from a settled map, a join, a leave and a crash (a
// leave whose shards are still held by the gone member) move exactly the
// minimum number of shards: only to the joiner, only the leaver's; the
// result is balanced, and Balance from any part-way state (half of the
// moves done) gives the same map, so replicas that list at different
// moments agree.
func TestBalanceMoves(t *testing.T) {
	type step struct {
		name   string
		before []string
		after  []string
	}
	var steps []step
	for _, n := range []int{7, 64, 1024} {
		for r := 1; r <= 10; r++ {
			steps = append(steps,
				step{fmt.Sprintf("n=%d join %d->%d", n, r, r+1), members(r), members(r + 1)},
				step{fmt.Sprintf("n=%d leave %d->%d", n, r+1, r), members(r + 1), members(r)},
				step{fmt.Sprintf("n=%d leave first of %d", n, r+1), members(r + 1), members(r + 1)[1:]})
		}
	}
	for _, st := range steps {
		var n int
		fmt.Sscanf(st.name, "n=%d", &n)
		t.Run(st.name, func(t *testing.T) {
			holders := shard.Assign(n, st.before)
			after := shard.Balance(n, st.after, holders)
			if d := spread(after, st.after); d > 1 {
				t.Errorf("counts %v differ by %d", count(after), d)
			}
			got, want := moved(holders, after), minMoves(n, st.after, holders)
			if got != want {
				t.Errorf("moved %d shards, the minimum is %d", got, want)
			}
			for s := range n {
				if holders[s] == after[s] {
					continue
				}
				joiner := !slices.Contains(st.before, after[s])
				leaver := !slices.Contains(st.after, holders[s])
				if !joiner && !leaver {
					t.Errorf("shard %d moved from %s to %s, neither joining nor leaving", s, holders[s], after[s])
				}
			}
			// Part-way: every other move done.
			mid := slices.Clone(holders)
			k := 0
			for s := range n {
				if holders[s] != after[s] {
					if k%2 == 0 {
						mid[s] = after[s]
					}
					k++
				}
			}
			if again := shard.Balance(n, st.after, mid); !slices.Equal(again, after) {
				t.Errorf("part-way, Balance changed its map on %d shards", moved(again, after))
			}
			if testing.Verbose() && (n == 1024 || n == 64) {
				t.Logf("moved %d of %d shards, minimum %d", got, n, want)
			}
		})
	}
}

// TestBalanceFromAnyHolders: from holders drawn from other maps (a stale
// or odd state), Balance still balances and keeps as many shards where
// they are as any balanced map could.
func TestBalanceFromAnyHolders(t *testing.T) {
	for _, n := range []int{5, 64, 1024} {
		for r := 1; r <= 6; r++ {
			ms := members(r)
			holders := shard.Assign(n, members(r+3)) // some held by non-members
			for s := 0; s < n; s += 5 {
				holders[s] = ""
			}
			after := shard.Balance(n, ms, holders)
			if d := spread(after, ms); d > 1 {
				t.Errorf("n=%d r=%d: counts differ by %d", n, r, d)
			}
			if got, want := moved(holders, after), minMoves(n, ms, holders); got != want {
				t.Errorf("n=%d r=%d: moved %d, minimum %d", n, r, got, want)
			}
		}
	}
}

// TestOf: an object's shard is stable and spread over all shards.
func TestOf(t *testing.T) {
	const n = 16
	seen := map[int]int{}
	for i := range 1600 {
		s := shard.Of("ns", fmt.Sprintf("obj-%d", i), n)
		if s < 0 || s >= n {
			t.Fatalf("shard %d out of range", s)
		}
		if shard.Of("ns", fmt.Sprintf("obj-%d", i), n) != s {
			t.Fatal("not stable")
		}
		seen[s]++
	}
	for s := range n {
		if seen[s] < 50 || seen[s] > 150 {
			t.Errorf("shard %d got %d of 1600 objects", s, seen[s])
		}
	}
}

// TestRunnerUp: the shards a replica registers for as runner-up are those
// of another member that Balance without that member gives it.
func TestRunnerUp(t *testing.T) {
	const n = 64
	for m := 1; m <= 5; m++ {
		ms := members(m)
		holders := shard.Assign(n, ms)
		got := map[string]map[int]bool{}
		for _, self := range ms {
			got[self] = shard.RunnersUp(n, ms, holders, self)
		}
		for _, y := range ms {
			rest := slices.DeleteFunc(slices.Clone(ms), func(x string) bool { return x == y })
			after := shard.Balance(n, rest, holders)
			for s := range n {
				if holders[s] != y {
					continue
				}
				for _, self := range rest {
					if got[self][s] != (after[s] == self) {
						t.Errorf("%d members, shard %d of %s: runner-up %s is %v, Balance without %s gives %s",
							m, s, y, self, got[self][s], y, after[s])
					}
				}
			}
		}
	}
}
