package robustness_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/internal/robustness"
)

func TestMain(m *testing.M) {
	robustness.MaybeRunWorker() // the test binary is also the worker process
	pgtest.Main(m)
}

// TestRobustness is the short run of make test: every fault kind for
// $PGLEASE_ROBUSTNESS_DURATION (default 45 s; 15 s with -short), with a seed
// from the clock unless $PGLEASE_ROBUSTNESS_SEED is set. A failure logs the
// seed, the command that replays the schedule, and the offending operations;
// the history is kept in $PGLEASE_ROBUSTNESS_OUT or a temporary file.
func TestRobustness(t *testing.T) {
	d, seed := runParams(t, 45*time.Second)
	t.Logf("seed %d; replay: PGLEASE_ROBUSTNESS_SEED=%d PGLEASE_ROBUSTNESS_DURATION=%v go test -count=1 -run TestRobustness ./test/robustness/", seed, seed, d)

	ctx, cancel := context.WithTimeout(context.Background(), d+90*time.Second)
	defer cancel()
	h, err := robustness.Run(ctx, robustness.Config{Seed: seed, Duration: d, Clients: 6, Procs: 3, Keys: 3, Faults: robustness.AllFaults, Logf: t.Logf})
	if err != nil {
		t.Errorf("run: %v", err)
	}
	if h == nil || len(h.Ops) == 0 {
		t.Fatal("no history")
	}
	res := robustness.Check(h, robustness.CheckOptions{LinTimeout: 20 * time.Second})
	var buf bytes.Buffer
	robustness.Summary(&buf, h, res)
	t.Log("\n" + buf.String())

	out := os.Getenv("PGLEASE_ROBUSTNESS_OUT")
	if out == "" && len(res.Violations) > 0 {
		out = filepath.Join(os.TempDir(), "pglease-robustness-"+strconv.FormatInt(seed, 10)+".json")
	}
	if out != "" {
		if err := robustness.WriteHistoryFile(out, h); err != nil {
			t.Error(err)
		} else {
			t.Logf("history written to %s (check again: go run ./cmd/pglease-robustness -check %s)", out, out)
		}
	}
	if len(res.Violations) > 0 {
		buf.Reset()
		robustness.Report(&buf, h, res, 10)
		t.Errorf("seed %d: %d violations\n%s", seed, len(res.Violations), buf.String())
	}
	// The run must have exercised what it claims to.
	for _, k := range robustness.AllFaults {
		if res.FaultsByKind[k] == 0 && d >= 30*time.Second {
			t.Errorf("no %s fault was injected", k)
		}
	}
	if res.OpsByKind[robustness.KAcquire][robustness.SGranted] == 0 || res.OpsByKind[robustness.KRenew][robustness.SOk] == 0 || res.OpsByKind[robustness.KGuard][robustness.SAccepted] == 0 {
		t.Errorf("the workload made no progress: %v", res.OpsByKind)
	}
}

// TestRobustnessFailover: the randomized workload with failover faults
// (asynchronous standby cut off, an unreplayed tail, primary killed,
// standby promoted, a new standby made), beside kills and connection
// faults, for $PGLEASE_ROBUSTNESS_DURATION (default 30 s; 15 s with -short).
// The history is checked with the rules that hold across a promotion
// (robustness.Check). Needs pg_lease 0.3.0: under 0.2.0 the promoted
// standby grants epochs the old primary already gave (I2/I3).
func TestRobustnessFailover(t *testing.T) {
	d, seed := runParams(t, 30*time.Second)
	t.Logf("seed %d; replay: PGLEASE_ROBUSTNESS_SEED=%d PGLEASE_ROBUSTNESS_DURATION=%v go test -count=1 -run TestRobustnessFailover ./test/robustness/", seed, seed, d)
	ctx, cancel := context.WithTimeout(context.Background(), d+2*time.Minute)
	defer cancel()
	faults := []string{robustness.FaultFailover, robustness.FaultKill, robustness.FaultProxy}
	h, err := robustness.Run(ctx, robustness.Config{Seed: seed, Duration: d, Clients: 6, Procs: 2, Keys: 3, Faults: faults, Logf: t.Logf})
	if err != nil {
		t.Errorf("run: %v", err)
	}
	if h == nil || len(h.Ops) == 0 {
		t.Fatal("no history")
	}
	res := robustness.Check(h, robustness.CheckOptions{LinTimeout: -1})
	var buf bytes.Buffer
	robustness.Summary(&buf, h, res)
	t.Log("\n" + buf.String())
	if len(res.Violations) > 0 {
		out := filepath.Join(os.TempDir(), "pglease-robustness-failover-"+strconv.FormatInt(seed, 10)+".json")
		if err := robustness.WriteHistoryFile(out, h); err == nil {
			t.Logf("history written to %s", out)
		}
		buf.Reset()
		robustness.Report(&buf, h, res, 10)
		t.Errorf("seed %d: %d violations\n%s", seed, len(res.Violations), buf.String())
	}
	if res.FaultsByKind[robustness.FaultFailover] == 0 {
		t.Error("no failover fault was injected")
	}
	for _, f := range h.Faults {
		if f.Err != "" {
			t.Errorf("fault %s failed: %s", f.Kind, f.Err)
		}
	}
	if !res.FailoverMode {
		t.Error("the checker did not check the history as a failover run")
	}
	if res.OpsByKind[robustness.KAcquire][robustness.SGranted] == 0 {
		t.Errorf("the workload made no progress: %v", res.OpsByKind)
	}
}

// runParams is a run's duration and seed: $PGLEASE_ROBUSTNESS_DURATION, or
// def (15 s with -short); $PGLEASE_ROBUSTNESS_SEED, or one from the clock.
func runParams(t *testing.T, def time.Duration) (time.Duration, int64) {
	t.Helper()
	d := def
	if testing.Short() {
		d = 15 * time.Second
	}
	if v := os.Getenv("PGLEASE_ROBUSTNESS_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	seed := time.Now().UnixNano() % 1_000_000_007
	if v := os.Getenv("PGLEASE_ROBUSTNESS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	return d, seed
}
