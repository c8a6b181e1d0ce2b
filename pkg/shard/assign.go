package shard

import (
	"hash/fnv"
	"slices"
	"sort"
)

// Of returns the shard of the object namespace/name among n shards: a
// stable hash (64-bit FNV-1a of "namespace/name") modulo n. It never
// depends on the members, so an object stays in its shard for the life of
// the controller (n is fixed per controller).
func Of(namespace, name string, n int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(namespace))
	_, _ = h.Write([]byte{'/'})
	_, _ = h.Write([]byte(name))
	return int(h.Sum64() % uint64(n))
}

// weight is the rendezvous weight of member for shard s: the member's
// FNV-1a hash and the shard number, each spread by the splitmix64 finalizer
// before they are combined and spread again. Names that differ in one
// character (replica-0, replica-1) get unrelated weights.
func weight(s int, member string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	return mix(mix(h.Sum64()) ^ mix(uint64(s)+0x9e3779b97f4a7c15))
}

// mix is the splitmix64 finalizer: a bijection whose output bits each
// depend on every input bit.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Assign is Balance with no shard held: the assignment a controller starts
// from. No member: nil.
func Assign(n int, members []string) []string { return Balance(n, members, nil) }

// Balance maps each of n shards to one of members so that the members'
// shard counts differ by at most one, moving as few shards as possible from
// holders, where holders[s] names the member holding shard s ("" or a name
// that is no member: nobody; nil: no shard held). Every replica that sees
// the same members and holders computes the same map:
//
//   - caps: with n = q*len(members) + r, r members may hold q+1 shards and
//     the others q; the r go first to members holding more than q shards,
//     then in the order of a hash of the name;
//   - a member keeps the shards it holds up to its cap (those of highest
//     rendezvous weight for it);
//   - every other shard goes to the member of highest rendezvous weight
//     for it among those with room, taken in order of weight over all
//     (shard, member) pairs.
//
// So a join moves shards only to the joiner, a leave moves only the leaver's
// shards, and a crash only the crashed member's: exactly the shards that
// must move (once the holders match an earlier Balance). The answer is
// stable while those moves run: the map from holders part-way through is
// the same.
func Balance(n int, members []string, holders []string) []string {
	ms := slices.Compact(slices.Sorted(slices.Values(members)))
	if len(ms) == 0 || n <= 0 {
		return nil
	}
	idx := make(map[string]int, len(ms))
	for i, m := range ms {
		idx[m] = i
	}
	held := make([][]int, len(ms))
	for s, h := range holders {
		if i, ok := idx[h]; ok && s < n {
			held[i] = append(held[i], s)
		}
	}
	room := caps(n, ms, held)
	out := make([]string, n)
	for i, m := range ms {
		hs := held[i]
		sort.Slice(hs, func(a, b int) bool { return heavier(hs[a], hs[b], m) })
		for _, s := range hs[:min(len(hs), room[i])] {
			out[s] = m
		}
		room[i] -= min(len(hs), room[i])
	}
	fill(out, ms, room)
	return out
}

// caps returns each member's cap: q, or q+1 for r of them (those holding
// more than q first, then by the hash of the name, then by name).
func caps(n int, ms []string, held [][]int) []int {
	q, r := n/len(ms), n%len(ms)
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		i, j := order[a], order[b]
		if ovi, ovj := len(held[i]) > q, len(held[j]) > q; ovi != ovj {
			return ovi
		}
		if hi, hj := weight(-1, ms[i]), weight(-1, ms[j]); hi != hj {
			return hi > hj
		}
		return ms[i] < ms[j]
	})
	c := make([]int, len(ms))
	for k, i := range order {
		c[i] = q
		if k < r {
			c[i]++
		}
	}
	return c
}

// heavier orders shards by member's weight, highest first (ties: lower shard).
func heavier(a, b int, member string) bool {
	if wa, wb := weight(a, member), weight(b, member); wa != wb {
		return wa > wb
	}
	return a < b
}

// fill gives every shard out leaves "" to a member with room, over all
// (shard, member) pairs in order of weight, highest first.
func fill(out []string, ms []string, room []int) {
	type pair struct {
		s, i int
		w    uint64
	}
	var pairs []pair
	for s, o := range out {
		if o != "" {
			continue
		}
		for i, m := range ms {
			if room[i] > 0 {
				pairs = append(pairs, pair{s, i, weight(s, m)})
			}
		}
	}
	sort.Slice(pairs, func(a, b int) bool {
		if pairs[a].w != pairs[b].w {
			return pairs[a].w > pairs[b].w
		}
		if pairs[a].s != pairs[b].s {
			return pairs[a].s < pairs[b].s
		}
		return pairs[a].i < pairs[b].i
	})
	for _, p := range pairs {
		if out[p.s] == "" && room[p.i] > 0 {
			out[p.s] = ms[p.i]
			room[p.i]--
		}
	}
}

// runnersUp returns the shards that would come to self were one other
// member to leave: for each member y but self, the shards holders gives y
// that Balance without y gives self. A leaving owner's release hands each
// of them to self. A round passes the assignment as holders: the state the
// moves under way lead to.
func runnersUp(n int, members, holders []string, self string) map[int]bool {
	out := map[int]bool{}
	for _, y := range members {
		if y == self {
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == y })
		hs := slices.Clone(holders)
		var mine []int
		for s, h := range hs {
			if h == y {
				hs[s] = ""
				mine = append(mine, s)
			}
		}
		if len(mine) == 0 {
			continue
		}
		after := Balance(n, rest, hs)
		for _, s := range mine {
			if after[s] == self {
				out[s] = true
			}
		}
	}
	return out
}
