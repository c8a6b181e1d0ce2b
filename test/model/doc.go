// Package model replays the Quint model's traces (specs/model) against the
// real SQL: the model's replay configuration exports random traces
// (quint run --out-itf), and each step is called through pg_lease's public
// API on a throwaway server whose clock the test moves with the model's, and
// every answer (status, epoch, expiry, error, and lease.inspect after the
// step) is compared with the model's. A mismatch fails the test and prints
// the trace. The package has no code outside its tests.
//
// Environment: PGLEASE_MODEL_SEED (the traces' seed), PGLEASE_MODEL_TRACES
// (how many), PGLEASE_MODEL_STEPS (steps per trace), PGLEASE_MODEL_SQL (a
// plain install script to replay against instead of the repository's
// extension, as hack/defects.sh writes them).
package model
