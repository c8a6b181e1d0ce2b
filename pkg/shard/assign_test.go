package shard_test

import (
	"fmt"
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

// TestAssignBalance: with 256 shards, every member of 2 to 8 gets a share
// within 40% of the mean, and the answer does not depend on the order in
// which members are given.
func TestAssignBalance(t *testing.T) {
	const n = 256
	for r := 2; r <= 8; r++ {
		ms := members(r)
		owners := shard.Assign(n, ms)
		rev := append([]string(nil), ms...)
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		if fmt.Sprint(shard.Assign(n, rev)) != fmt.Sprint(owners) {
			t.Errorf("%d members: the assignment depends on the members' order", r)
		}
		mean := float64(n) / float64(r)
		for _, m := range ms {
			got := float64(count(owners)[m])
			if got < 0.6*mean || got > 1.4*mean {
				t.Errorf("%d members: %s owns %v shards, mean %.1f", r, m, got, mean)
			}
		}
	}
	if shard.Assign(n, nil) != nil {
		t.Error("no member: want no assignment")
	}
}

// TestAssignMinimalMovement: a member that joins takes shards only, all to
// itself, about n/(r+1) of them; a member that leaves moves only its own.
func TestAssignMinimalMovement(t *testing.T) {
	const n = 256
	for r := 1; r <= 6; r++ {
		before := shard.Assign(n, members(r))
		after := shard.Assign(n, members(r+1))
		joiner := members(r + 1)[r]
		moved := 0
		for s := range n {
			if before[s] != after[s] {
				moved++
				if after[s] != joiner {
					t.Errorf("join of %s: shard %d moved from %s to %s", joiner, s, before[s], after[s])
				}
			}
		}
		if mean := float64(n) / float64(r+1); float64(moved) < 0.6*mean || float64(moved) > 1.4*mean {
			t.Errorf("join to %d members moved %d shards, about %.0f expected", r+1, moved, mean)
		}
		// The joiner leaves again: exactly its shards move back.
		for s := range n {
			if after[s] != joiner && after[s] != before[s] {
				t.Errorf("leave of %s: shard %d of %s moved", joiner, s, after[s])
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

// TestRunnerUp: the runner-up of each shard (the replica a leaving owner
// hands it to) is the member Assign names once the owner is gone.
func TestRunnerUp(t *testing.T) {
	const n = 64
	for m := 1; m <= 5; m++ {
		ms := members(m)
		first, second := shard.Ranked(n, ms)
		for s := range n {
			if first[s] != shard.Assign(n, ms)[s] {
				t.Fatalf("%d members, shard %d: first %s, Assign %s", m, s, first[s], shard.Assign(n, ms)[s])
			}
			var rest []string
			for _, x := range ms {
				if x != first[s] {
					rest = append(rest, x)
				}
			}
			want := ""
			if len(rest) > 0 {
				want = shard.Assign(n, rest)[s]
			}
			if second[s] != want {
				t.Errorf("%d members, shard %d: runner-up %q, want %q", m, s, second[s], want)
			}
		}
	}
}
