package hostile

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

func calls(n int, from, every time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = from + time.Duration(i)*every
	}
	return out
}

// A spin is found in the window where it happens; a party at its cadence
// is not, however long it runs.
func TestRateViolations(t *testing.T) {
	spin := Calls{Party: "elector/pod-b", Limit: 100, At: append(calls(20, 0, 300*ms), calls(600, 10*time.Second, ms)...)}
	steady := Calls{Party: "elector/pod-a", Limit: 100, At: calls(1000, 0, 20*ms)} // 50/s for 20 s
	v := RateViolations([]Calls{spin, steady})
	if len(v) != 1 || !strings.Contains(v[0].What, "elector/pod-b sent 600 statements") || v[0].At != 10*time.Second {
		t.Fatalf("got %v, want one violation of pod-b: 600 statements from 10s", v)
	}
	// Exactly at the limit is allowed.
	if v := RateViolations([]Calls{{Party: "x", Limit: 100, At: calls(200, 0, 10*ms)}}); len(v) != 0 {
		t.Fatalf("200 statements in 2s at a limit of 100/s: %v", v)
	}
}

// Within one party's observations of one source the epoch never goes
// down; across parties, a read sent after another observation was received
// never shows a lower epoch. Reads that overlap in time may.
func TestEpochViolations(t *testing.T) {
	seq := []Obs{
		{Key: "k", Party: "elector/pod-a#0", Source: "OnNewLeader", Epoch: 3, Sent: -1, Recv: 1 * time.Second, Seq: 1},
		{Key: "k", Party: "elector/pod-a#0", Source: "OnNewLeader", Epoch: 1 << 50, Sent: -1, Recv: 2 * time.Second, Seq: 2},
		{Key: "k", Party: "elector/pod-a#0", Source: "OnNewLeader", Epoch: 4, Sent: -1, Recv: 3 * time.Second, Seq: 3},
	}
	v := EpochViolations(seq)
	if len(v) != 1 || !strings.Contains(v[0].What, "at epoch 4 (OnNewLeader, 3.000s) after epoch 1125899906842624") {
		t.Fatalf("got %v, want epoch 4 after the forged one", v)
	}
	cross := []Obs{
		{Key: "k", Party: "a", Source: "inspect", Epoch: 5, Sent: 900 * ms, Recv: 1000 * ms, Seq: 1},
		{Key: "k", Party: "b", Source: "inspect", Epoch: 4, Sent: 950 * ms, Recv: 1100 * ms, Seq: 1},  // overlaps a's read: fine
		{Key: "k", Party: "c", Source: "inspect", Epoch: 4, Sent: 1200 * ms, Recv: 1300 * ms, Seq: 1}, // after a's: stale
		{Key: "j", Party: "c", Source: "inspect", Epoch: 1, Sent: 1400 * ms, Recv: 1500 * ms, Seq: 1}, // another key
	}
	v = EpochViolations(cross)
	if len(v) != 1 || !strings.Contains(v[0].What, "c read k at epoch 4") || !strings.Contains(v[0].What, "a had seen epoch 5") {
		t.Fatalf("got %v, want c's read of k below a's", v)
	}
	if v := EpochViolations(cross[:2]); len(v) != 0 {
		t.Fatalf("overlapping reads: %v", v)
	}
}

// Two parties' believed terms of one key may touch but not overlap; one
// epoch is believed by one party.
func TestOverlapViolations(t *testing.T) {
	terms := []Term{
		{Key: "k", Party: "a", Role: "r", Epoch: 1, Start: 0, End: time.Second},
		{Key: "k", Party: "b", Role: "r", Epoch: 2, Start: time.Second, End: 2 * time.Second}, // touches: fine
		{Key: "j", Party: "c", Role: "r", Epoch: 1, Start: 500 * ms, End: 3 * time.Second},    // another key
	}
	if v := OverlapViolations(terms); len(v) != 0 {
		t.Fatalf("terms that do not overlap: %v", v)
	}
	terms = append(terms, Term{Key: "k", Party: "c", Role: "r", Epoch: 3, Start: 1900 * ms, End: 2500 * ms})
	v := OverlapViolations(terms)
	if len(v) != 1 || !strings.Contains(v[0].What, "b (r) believed epoch 2 over [1.000s, 2.000s] and c (r) epoch 3 over [1.900s, 2.500s]") {
		t.Fatalf("got %v, want b and c overlapping", v)
	}
	v = OverlapViolations([]Term{
		{Key: "k", Party: "a", Epoch: 7, Start: 0, End: time.Second},
		{Key: "k", Party: "b", Epoch: 7, Start: 2 * time.Second, End: 3 * time.Second},
	})
	if len(v) != 1 || !strings.Contains(v[0].What, "epoch 7 believed by a") {
		t.Fatalf("got %v, want epoch 7 believed twice", v)
	}
}

// A hostile backend's locks count as left behind only once its call
// returned, with its transaction open, and when none of its calls changed
// an honest key.
func TestRegistryLeftBehind(t *testing.T) {
	r := newRegistry()
	r.add(1, "eve1#0", "eve1")
	if _, _, ok := r.leftBehind(1); ok {
		t.Fatal("an idle backend left a lock behind")
	}
	r.begin(1)
	r.start(1, "listen(k)", []string{"k"}, false)
	if _, _, ok := r.leftBehind(1); ok {
		t.Fatal("a running call counted as left behind")
	}
	if got := r.activeOn("k"); len(got) != 1 || !strings.Contains(got[0], "listen(k) (running)") {
		t.Fatalf("activeOn: %v", got)
	}
	r.finish(1, false)
	desc, tx, ok := r.leftBehind(1)
	if !ok || desc != "eve1#0 after listen(k)" || tx != "1/1" {
		t.Fatalf("after the call: %q %q %v", desc, tx, ok)
	}
	r.start(1, "acquire(k)", []string{"k"}, true)
	r.finish(1, true)
	if _, _, ok := r.leftBehind(1); ok {
		t.Fatal("a transaction that changed an honest key counted as left behind")
	}
	r.end(1)
	if _, _, ok := r.leftBehind(1); ok || len(r.activeOn("k")) != 0 {
		t.Fatal("an ended transaction still counted")
	}
	// Outside a transaction, a returned call keeps nothing.
	r.start(1, "renew_many(k)", []string{"k"}, false)
	r.finish(1, false)
	if _, _, ok := r.leftBehind(1); ok {
		t.Fatal("an autocommit call counted as left behind")
	}
}

// The report names the seed on every violation and the state of every
// check.
func TestReport(t *testing.T) {
	res := Check(42, time.Second, Data{
		Violations: []Violation{{Check: CheckFreeKey, At: time.Second, What: "probe/0 denied"}},
		Terms:      []Term{{Key: "k", Party: "a", Epoch: 1, Start: 0, End: time.Second}, {Key: "k", Party: "b", Epoch: 2, Start: 0, End: time.Second}},
		Stats:      map[string]int{},
	})
	var b bytes.Buffer
	res.Report(&b, 10)
	out := b.String()
	for _, want := range []string{"check free-key    FAILED (1)", "check overlap     FAILED (1)", "check epochs      ok",
		"seed 42: [free-key]   1.000s probe/0 denied", "seed 42: [overlap]"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// A denial is laid to listen's instant row lock only when a listen of the
// key ran around it.
func TestOnlyListens(t *testing.T) {
	for _, c := range []struct {
		before, during []string
		n0, n1         uint64
		want           bool
	}{
		{nil, nil, 3, 3, false},
		{nil, nil, 3, 4, true},
		{[]string{"eve1#0: listen(k) (running)"}, nil, 3, 3, true},
		{[]string{"eve1#0: listen(k) (running)"}, []string{"eve2#0: fence(k) (running)"}, 3, 3, true},
		{[]string{"eve1#0: a loop of listen over k (running)"}, nil, 3, 3, true},
		{[]string{"eve2#0: fence(k) (running)"}, nil, 3, 3, false},
		{[]string{"eve1#0: listen(k) (transaction open)"}, nil, 3, 3, false},
		{[]string{"eve2#0: renew_many(3 keys) (running)"}, nil, 3, 4, true},
		{[]string{"eve2#0: renew_many(3 keys) (running)"}, nil, 3, 3, false},
	} {
		if got := onlyListens(c.before, c.during, c.n0, c.n1); got != c.want {
			t.Errorf("onlyListens(%q, %q, %d, %d) = %v, want %v", c.before, c.during, c.n0, c.n1, got, c.want)
		}
	}
}
