// Package fuzz holds Go native fuzz targets for pg_lease's SQL API, each
// against a real throwaway PostgreSQL (internal/pgtest):
//
//   - FuzzClient: every call of pkg/lease (Acquire, AcquireWait, Renew,
//     Release, Inspect, List, Fence) and leaseadmin.ForceRelease with fuzzed
//     keys, owners, epochs and durations, from a fuzzed starting state of
//     the key (never leased, held by the caller, held by another owner,
//     free, lapsed);
//   - FuzzSQL: every lease.* function called with raw pgx, typed
//     parameters and typed NULLs, with intervals given as any text
//     PostgreSQL parses as an interval (extremes included).
//
// The property: every input yields a valid result (a grant, a denial, a
// status, a state) consistent with the starting state, or SQLSTATE 22023
// with a DETAIL naming each invalid argument and, through pkg/lease,
// lease.ErrInvalidInput; never another SQLSTATE, never a panic, and no
// change of lease.leases or lease.epoch_floor by a call that failed.
//
// What is valid comes from one place, expect_test.go: the validation rules
// of each pg_lease version (selected by lease.version() of the installed
// SQL), and the known deviations still accepted, each named with its issue.
//
//	go test ./test/fuzz                                   # the seed corpus (testdata/fuzz) only
//	go test ./test/fuzz -run '^$' -fuzz '^FuzzClient$' -fuzztime 20s -parallel 1
//	make fuzz                                             # both targets, FUZZTIME each (default 10m)
//
// PGLEASE_FUZZ_SQL=<file> installs that script (base and update scripts
// concatenated, \ lines dropped, @extowner@ = the superuser) as a plain
// schema instead of the extension: hack/mutate.py's "go" suite runs the
// seed corpus against each mutant this way.
package fuzz
