package shard

// ErrCrash, as the cause of Run's context, stops a Sharder without
// releasing anything, as a crashed replica would.
var ErrCrash = errCrash

// Ranked is ranked: each shard's owner and runner-up.
var Ranked = ranked
