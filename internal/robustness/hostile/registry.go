package hostile

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// registry knows every hostile backend: which call it runs now, and which
// calls its open transaction made. The monitor and the probes read it to
// say what another role was doing when an honest call was refused or
// waited (checks 1 and 8).
type registry struct {
	mu sync.Mutex
	b  map[uint32]*backend
	// listens counts the listen calls begun on each key (see onlyListens).
	listens map[string]uint64
}

type backend struct {
	name    string // role and actor
	role    string
	inTx    bool
	tx      int // transactions begun
	calls   []hcall
	running *hcall
}

// hcall is one call of a hostile backend. changed: it changed (or, while
// running, may change) the lease row of an honest key, as any role may by
// acquiring a free key: the row lock that change keeps is the key's own
// grant in flight, not a lock left behind.
type hcall struct {
	desc    string
	keys    []string
	changed bool
}

func newRegistry() *registry { return &registry{b: map[uint32]*backend{}} }

func (r *registry) add(pid uint32, name, role string) {
	r.mu.Lock()
	r.b[pid] = &backend{name: name, role: role}
	r.mu.Unlock()
}

func (r *registry) remove(pid uint32) {
	r.mu.Lock()
	delete(r.b, pid)
	r.mu.Unlock()
}

func (r *registry) get(pid uint32) *backend {
	b := r.b[pid]
	if b == nil {
		b = &backend{name: "unknown"}
		r.b[pid] = b
	}
	return b
}

// begin: the backend opened a transaction.
func (r *registry) begin(pid uint32) {
	r.mu.Lock()
	b := r.get(pid)
	b.inTx, b.calls = true, nil
	b.tx++
	r.mu.Unlock()
}

// end: its transaction ended (commit or rollback).
func (r *registry) end(pid uint32) {
	r.mu.Lock()
	b := r.get(pid)
	b.inTx, b.calls = false, nil
	r.mu.Unlock()
}

// start: a call begins; mayChange says whether it may change an honest
// key's row.
func (r *registry) start(pid uint32, desc string, keys []string, mayChange bool) {
	r.mu.Lock()
	r.get(pid).running = &hcall{desc: desc, keys: keys, changed: mayChange}
	if isListen(desc) {
		if r.listens == nil {
			r.listens = map[string]uint64{}
		}
		for _, k := range keys {
			r.listens[k]++
		}
	}
	r.mu.Unlock()
}

// listensOn returns how many listen calls have begun on key.
func (r *registry) listensOn(key string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listens[key]
}

// isListen: the call is a listen, or a loop of them.
func isListen(desc string) bool {
	return strings.HasPrefix(desc, "listen(") || strings.HasPrefix(desc, "a loop of listen ")
}

// onlyListens: a hostile listen of the key ran around a denial: one was
// running at a sample, or one began between the samples (n0, n1: listensOn
// before and after). lease.listen takes the key's row lock for an instant to
// wait out a change in flight, and a wait-0 acquire at that instant is
// denied: a documented limit (specs/THREATS.md), counted apart. A listen left
// in an open transaction holds no lock and does not count. Every other
// denial of a free key is a violation.
func onlyListens(before, during []string, n0, n1 uint64) bool {
	if n1 > n0 {
		return true
	}
	for _, c := range append(append([]string(nil), before...), during...) {
		_, desc, _ := strings.Cut(c, ": ")
		if isListen(desc) && strings.HasSuffix(desc, "(running)") {
			return true
		}
	}
	return false
}

// finish: the running call returned; changed says whether it changed an
// honest key's row.
func (r *registry) finish(pid uint32, changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.get(pid)
	if b.running == nil {
		return
	}
	c := *b.running
	c.changed = changed
	b.running = nil
	if b.inTx {
		b.calls = append(b.calls, c)
	}
}

// activeOn lists the hostile calls touching key that run now or whose
// transaction is still open.
func (r *registry) activeOn(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, b := range r.b {
		if c := b.running; c != nil && slices.Contains(c.keys, key) {
			out = append(out, fmt.Sprintf("%s: %s (running)", b.name, c.desc))
		}
		for _, c := range b.calls {
			if slices.Contains(c.keys, key) {
				out = append(out, fmt.Sprintf("%s: %s (transaction open)", b.name, c.desc))
			}
		}
	}
	sort.Strings(out)
	return out
}

// leftBehind describes what a hostile backend that an honest backend waits
// for is doing: ok is true only when the backend is known, its transaction
// is open with no call running, and none of its calls changed an honest
// key: every lock it holds is left behind by calls that granted nothing.
// tx identifies the transaction.
func (r *registry) leftBehind(pid uint32) (desc string, tx string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.b[pid]
	if b == nil || !b.inTx || b.running != nil || len(b.calls) == 0 {
		return "", "", false
	}
	var ds []string
	for _, c := range b.calls {
		if c.changed {
			return "", "", false
		}
		ds = append(ds, c.desc)
	}
	return fmt.Sprintf("%s after %s", b.name, strings.Join(ds, "; ")), fmt.Sprintf("%d/%d", pid, b.tx), true
}

// signatures returns, for every backend, a string that changes whenever
// its transaction, its calls or its running call change: a state read
// before and after a query held during the query.
func (r *registry) signatures() map[uint32]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[uint32]string, len(r.b))
	for pid, b := range r.b {
		out[pid] = fmt.Sprintf("%d/%v/%d/%v", b.tx, b.inTx, len(b.calls), b.running != nil)
	}
	return out
}

// kind names what a hostile backend is doing, for the statistics: the
// running call, or else the first call of its open transaction.
func (r *registry) kind(pid uint32) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.b[pid]
	var c *hcall
	switch {
	case b == nil:
		return "unknown backend"
	case b.running != nil:
		c = b.running
	case len(b.calls) > 0:
		c = &b.calls[0]
	default:
		return "idle"
	}
	name, _, _ := strings.Cut(c.desc, "(")
	return name
}
