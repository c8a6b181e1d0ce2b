// Package testprog holds what the tests share with their subprocess
// programs: the candidate's event format (internal/testprog/candidate, run
// as internal/testprog/cmd/pglease-candidate or by the demo re-executing
// itself). It imports nothing of pg_lease, so a test that only reads events
// links neither the elector nor the fence.
package testprog

// CandidatePkg is the import path of the candidate program (for
// pgtest.BuildProgram).
const CandidatePkg = "github.com/pglease/pg_lease/internal/testprog/cmd/pglease-candidate"

// EnvVar, set to any value, makes a program that embeds the candidate (the
// demo) run it instead of itself.
const EnvVar = "PGLEASE_TESTCANDIDATE"

// Event is one line of the candidate's output (JSON).
type Event struct {
	// Ev is offset, started, renewed, working, write, cancelled, stopped,
	// exit, error (elector mode); acquired, renew, write, fence, done
	// (holder mode; Status carries the outcome).
	Ev string `json:"ev"`
	ID string `json:"id"`
	// Wall is the local wall clock (unix ns) when the event happened.
	Wall  int64 `json:"wall"`
	Epoch int64 `json:"epoch,omitempty"`
	// Expires is the server-clock expiry (unix ns) of the grant (started,
	// renewed, stopped: the term's latest grant); Acquired its start.
	Expires  int64 `json:"expires,omitempty"`
	Acquired int64 `json:"acquired,omitempty"`
	// Deadline is the term's local deadline (unix ns, local wall clock):
	// the end of its leadership on the local clock unless cancelled
	// earlier.
	Deadline int64  `json:"deadline,omitempty"`
	Cause    string `json:"cause,omitempty"`
	Err      string `json:"err,omitempty"`
	Stale    bool   `json:"stale,omitempty"`
	// Status is the holder mode's outcome: ok, lapsed, not_owner,
	// epoch_mismatch, error (renew, fence); accepted, rejected, error (write).
	Status string `json:"status,omitempty"`
	// Offset is the server clock minus the local clock (ns), Uncert its
	// uncertainty (half the round trip).
	Offset int64 `json:"offset,omitempty"`
	Uncert int64 `json:"uncert,omitempty"`
}
