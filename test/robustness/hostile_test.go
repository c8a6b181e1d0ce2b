package robustness_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/robustness/hostile"
)

// TestHostileTenants is the hostile-tenant mode (internal/robustness/hostile):
// honest electors, client-go locks, a sharded controller, handovers and
// free-key probes, each as a role of its own, while hostile roles act at
// random for $PGLEASE_HOSTILE_DURATION (default 30 s; 15 s with -short),
// seeded from the clock unless $PGLEASE_HOSTILE_SEED is set. Every check
// of an honest outcome must hold; a failure names the check, the seed and
// what happened.
func TestHostileTenants(t *testing.T) {
	d := 30 * time.Second
	if testing.Short() {
		d = 15 * time.Second
	}
	if v := os.Getenv("PGLEASE_HOSTILE_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	seed := time.Now().UnixNano() % 1_000_000_007
	if v := os.Getenv("PGLEASE_HOSTILE_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d; replay: PGLEASE_HOSTILE_SEED=%d PGLEASE_HOSTILE_DURATION=%v go test -count=1 -run TestHostileTenants ./test/robustness/", seed, seed, d)
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Minute)
	defer cancel()
	res, err := hostile.Run(ctx, hostile.Config{Seed: seed, Duration: d, Logf: t.Logf})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var buf bytes.Buffer
	res.Report(&buf, 10)
	t.Log("\n" + buf.String())
	if len(res.Violations) > 0 {
		t.Errorf("seed %d: %d honest outcomes changed by hostile roles (report above)", seed, len(res.Violations))
	}
	// The run must have exercised what it claims to.
	for _, stat := range []string{"terms: elector", "terms: client-go", "terms: shard", "terms: handover", "probes: granted",
		"hostile: open transactions", "hostile: renew_many batches", "hostile: forged notifications",
		"hostile: history flood cycles", "hostile: candidacy rounds", "hostile: squatted schemas", "hostile: call loops", "hostile: listens held open"} {
		if res.Stats[stat] == 0 {
			t.Errorf("the run made no %q", stat)
		}
	}
	for k, n := range res.Stats {
		if len(k) > 7 && k[:7] == "errors:" && n > 0 {
			t.Errorf("%s (%d)", k, n)
		}
	}
}
