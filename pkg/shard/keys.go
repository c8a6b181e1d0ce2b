package shard

import (
	"fmt"
	"strconv"
	"strings"
)

// The pg_lease keys of a controller: one per member and one per shard.
//
//	<controller>/member/<identity>   held by each live replica
//	<controller>/shard/<s>           held by the replica that owns shard s
//	<controller>/changed             acquired and released at once by a
//	                                 replica that joins or leaves, so that
//	                                 the others, watching it, recompute now

// MemberKey is the member key of identity.
func MemberKey(controller, identity string) string { return controller + "/member/" + identity }

// Key is the key of shard s.
func Key(controller string, s int) string { return controller + "/shard/" + strconv.Itoa(s) }

func changedKey(controller string) string { return controller + "/changed" }

// parseShard returns s for a key "<controller>/shard/<s>" with 0 <= s < n.
func parseShard(controller, key string, n int) (int, bool) {
	rest, ok := strings.CutPrefix(key, controller+"/shard/")
	if !ok {
		return 0, false
	}
	s, err := strconv.Atoi(rest)
	if err != nil || s < 0 || s >= n || strconv.Itoa(s) != rest {
		return 0, false
	}
	return s, true
}

func memberOf(controller, key string) (string, bool) {
	return strings.CutPrefix(key, controller+"/member/")
}

func shardName(s int) string { return fmt.Sprint(s) }
