package shard

// ErrCrash, as the cause of Run's context, stops a Sharder without
// releasing anything, as a crashed replica would.
var ErrCrash = errCrash

// RunnersUp is runnersUp.
func RunnersUp(n int, members, holders []string, self string) map[int]bool {
	return runnersUp(n, members, holders, self)
}
