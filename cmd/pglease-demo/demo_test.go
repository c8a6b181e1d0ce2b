package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/testprog"
	tc "github.com/pglease/pg_lease/internal/testprog/candidate"
)

// TestMain lets the test binary play the candidates: demo re-executes
// os.Executable(), which here is this binary.
func TestMain(m *testing.M) {
	if os.Getenv(testprog.EnvVar) != "" {
		tc.Main() // exits
	}
	os.Exit(m.Run())
}

// TestDemo runs the whole demo and checks the story it tells: a leader, a
// takeover with a higher epoch after the kill, a third leader after the
// freeze, and the frozen leader's stale write rejected.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := demo(ctx, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	m := regexp.MustCompile(`summary: epochs (\d+) < (\d+) < (\d+); \S+ holds "demo-leader" with epoch (\d+); the stale write of epoch (\d+) was rejected`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no summary line")
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	if !(n(1) < n(2) && n(2) < n(3) && n(4) == n(3) && n(5) == n(2)) {
		t.Fatalf("summary epochs out of order: %v", m[1:])
	}
	for _, want := range []string{
		"takeover: ",
		"REJECTED by the store: fence: write to \"demo-leader\" with epoch " + m[2] + " rejected",
		"throwaway PostgreSQL stopped and removed",
	} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Fatalf("demo output lacks %q", want)
		}
	}
}
