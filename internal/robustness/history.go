// Package robustness runs pg_lease under randomized faults and checks the
// recorded history against the invariants of SPEC-NOTES (I1, I2, I3, I9,
// I11), a fencing guard, and a linearizable single-key model (porcupine).
//
// The design follows etcd's robustness tests (traffic, failpoints, validate)
// and Jepsen: clients with their own connections run a seeded random
// workload against a throwaway server while an injector, driven by the same
// seed, kills and restarts the server, cuts and blackholes connections
// through a loopback TCP proxy, freezes client processes (SIGSTOP) and jumps
// the server clock (libfaketime). Every operation's invocation and response
// go into a History; Check decides whether the history is allowed.
package robustness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"syscall"
	"unsafe"
)

// Never is the Return of an operation whose outcome is unknown and whose
// effect could not be bounded in time (the backend that ran it was not seen
// to end).
const Never int64 = math.MaxInt64

// Mono is CLOCK_MONOTONIC in nanoseconds: one clock for every process of a
// run (Go's own monotonic readings are relative to each process's start).
func Mono() int64 {
	var ts syscall.Timespec
	// CLOCK_MONOTONIC = 1 on Linux.
	_, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	if e != 0 {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", e))
	}
	return ts.Nano()
}

// Operation kinds.
const (
	KAcquire     = "acquire"      // lease.acquire, wait 0
	KAcquireWait = "acquire_wait" // lease.acquire with a short server-side wait
	KRenew       = "renew"
	KRelease     = "release"
	KInspect     = "inspect"
	KGuard       = "guard" // conditional UPDATE of guard(resource, epoch)
)

// Outcomes.
const (
	OK      = "ok"      // the server answered; Status says what it decided
	Fail    = "fail"    // definitely no effect (error raised, or never sent)
	Unknown = "unknown" // the request may or may not have taken effect
)

// Statuses (with OK outcomes).
const (
	SGranted       = "granted" // acquire: acquired = true
	SDenied        = "denied"  // acquire: acquired = false
	STimeout       = "timeout" // acquire_wait: SQLSTATE 57014 'timeout' (an OK outcome: the server decided)
	SOk            = "ok"      // renew, release
	SNotOwner      = "not_owner"
	SLapsed        = "lapsed"
	SEpochMismatch = "epoch_mismatch"
	SHeld          = "held"     // inspect
	SFree          = "free"     // inspect: row exists, not held
	SAbsent        = "absent"   // inspect: no row
	SAccepted      = "accepted" // guard
	SRejected      = "rejected" // guard
)

// Op is one operation of one client: input, local monotonic invocation and
// response times, and what the server said. Server times are Unix
// microseconds of the server's (possibly faked) clock: T0 is
// clock_timestamp() read in the same statement before the lease function
// ran, T1 after it returned; Expires is the returned expires_at.
type Op struct {
	ID     int    `json:"id"` // index in the History (set by Sort)
	Client int    `json:"client"`
	Seq    int    `json:"seq"` // per client
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	Owner  string `json:"owner"`
	Epoch  int64  `json:"epoch,omitempty"` // input epoch: renew, release, guard
	TTL    int64  `json:"ttl_us,omitempty"`
	Wait   int64  `json:"wait_us,omitempty"`

	Call   int64 `json:"call"`   // Mono() before sending
	Return int64 `json:"return"` // Mono() after the answer; for Unknown: when the backend was seen gone, or Never

	Outcome  string `json:"outcome"`
	Status   string `json:"status,omitempty"`
	OutEpoch int64  `json:"out_epoch,omitempty"` // acquire granted, inspect
	OutOwner string `json:"out_owner,omitempty"` // inspect held
	Expires  int64  `json:"expires,omitempty"`   // acquire granted, renew ok, inspect held
	T0       int64  `json:"t0,omitempty"`
	T1       int64  `json:"t1,omitempty"`
	GuardSeq int64  `json:"guard_seq,omitempty"` // guard accepted: the row's write counter after the write
	Err      string `json:"err,omitempty"`
	Failed   int64  `json:"failed,omitempty"` // Unknown: Mono() when the client saw the error
	// GraceUntil: an acquire denied with an expires_at (0.4.0: the server
	// withheld the grant in a grace, which ends then). Shown, not checked.
	GraceUntil int64 `json:"grace_until,omitempty"`
}

// Fault is one injected fault: [Start, End] in Mono() time.
type Fault struct {
	Kind   string `json:"kind"` // kill, proxy, stop, clock
	Mode   string `json:"mode,omitempty"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Target int    `json:"target,omitempty"` // stop: client id
	// Clock: offset of the server clock from real time before and after.
	OffsetBefore int64  `json:"offset_before_ns,omitempty"`
	OffsetAfter  int64  `json:"offset_after_ns,omitempty"`
	Detail       string `json:"detail,omitempty"`
	Err          string `json:"err,omitempty"`
}

// Meta describes a run.
type Meta struct {
	Seed     int64    `json:"seed"`
	Clients  int      `json:"clients"`
	Procs    int      `json:"procs"`
	Keys     []string `json:"keys"`
	Faults   []string `json:"faults"`
	Duration string   `json:"duration"`
	SQLFile  string   `json:"sql_file,omitempty"`
	Start    int64    `json:"start"`
	End      int64    `json:"end"`
}

// History is everything a run recorded.
type History struct {
	Meta   Meta    `json:"meta"`
	Ops    []Op    `json:"ops"`
	Faults []Fault `json:"faults"`
}

// Sort orders operations by invocation (then client, seq) and numbers them.
func (h *History) Sort() {
	sort.SliceStable(h.Ops, func(i, j int) bool {
		a, b := h.Ops[i], h.Ops[j]
		if a.Call != b.Call {
			return a.Call < b.Call
		}
		if a.Client != b.Client {
			return a.Client < b.Client
		}
		return a.Seq < b.Seq
	})
	for i := range h.Ops {
		h.Ops[i].ID = i
	}
	sort.SliceStable(h.Faults, func(i, j int) bool { return h.Faults[i].Start < h.Faults[j].Start })
}

// line is one record of the JSON-lines form (worker output, history files).
type line struct {
	Op    *Op    `json:"op,omitempty"`
	Fault *Fault `json:"fault,omitempty"`
	Meta  *Meta  `json:"meta,omitempty"`
}

// WriteJSONLines writes h as one JSON object per line.
func (h *History) WriteJSONLines(w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(line{Meta: &h.Meta}); err != nil {
		return err
	}
	for i := range h.Faults {
		if err := enc.Encode(line{Fault: &h.Faults[i]}); err != nil {
			return err
		}
	}
	for i := range h.Ops {
		if err := enc.Encode(line{Op: &h.Ops[i]}); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadHistory reads a history written by WriteJSONLines.
func ReadHistory(r io.Reader) (*History, error) {
	h := &History{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
		switch {
		case l.Meta != nil:
			h.Meta = *l.Meta
		case l.Fault != nil:
			h.Faults = append(h.Faults, *l.Fault)
		case l.Op != nil:
			h.Ops = append(h.Ops, *l.Op)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	h.Sort()
	return h, nil
}

// ReadHistoryFile reads a history file.
func ReadHistoryFile(path string) (*History, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadHistory(f)
}

// WriteHistoryFile writes h to path.
func WriteHistoryFile(path string, h *History) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := h.WriteJSONLines(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
