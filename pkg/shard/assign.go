package shard

import (
	"hash/fnv"
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

// Assign maps each of n shards to one of members by rendezvous (highest
// random weight) hashing: shard s goes to the member with the highest
// weight(s, member), ties to the lower name. Every replica that sees the
// same members computes the same map, with no state of its own. When a
// member joins, only the shards it now wins move, all to it; when one
// leaves, only its shards move, spread over the others. No member: nil.
func Assign(n int, members []string) []string {
	first, _ := ranked(n, members)
	return first
}

// ranked returns, for each of n shards, the member Assign names (first) and
// the member it would name were that one gone (second, "" with one
// member): the replica a leaving owner hands the shard to.
func ranked(n int, members []string) (first, second []string) {
	if len(members) == 0 {
		return nil, nil
	}
	ms := append([]string(nil), members...)
	sort.Strings(ms)
	first, second = make([]string, n), make([]string, n)
	for s := range n {
		best, next := -1, -1
		var bw, nw uint64
		for i, m := range ms {
			switch w := weight(s, m); {
			case best < 0 || w > bw:
				next, nw = best, bw
				best, bw = i, w
			case next < 0 || w > nw:
				next, nw = i, w
			}
		}
		first[s] = ms[best]
		if next >= 0 {
			second[s] = ms[next]
		}
	}
	return first, second
}
