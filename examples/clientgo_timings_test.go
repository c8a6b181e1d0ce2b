package examples_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// examples/clientgo checks client-go's timings against the lock before
// client-go sees them (resourcelock.Lock.LeaderElectionConfig): wrong
// timings are reported by field and the program exits 1 (client-go's
// RunOrDie would panic on some of them), and -lease-duration alone derives
// the others (it used to panic with the 10s/2s defaults).
func TestClientgoTimings(t *testing.T) {
	dsn := pgtest.NewLeaseDatabase(t)
	bin := build(t, "clientgo")
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-dsn", dsn, "-id", "x"}, args...)...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("%v: %v", args, err)
		}
		return o.String(), e.String(), code
	}

	_, stderr, code := run("-lease-duration", "3s", "-renew-deadline", "10s", "-retry-period", "2s")
	if code != 1 || strings.Contains(stderr, "panic") ||
		!strings.Contains(stderr, "LeaseDuration (3s) must be greater than RenewDeadline (10s)") ||
		!strings.Contains(stderr, "RenewDeadline (10s) + RetryPeriod (2s) = 12s must be below the lock's lease duration (3s)") {
		t.Fatalf("wrong timings: exit %d, stderr:\n%s", code, stderr)
	}
	_, stderr, code = run("-lease-duration", "15s", "-renew-deadline", "13s")
	if code != 1 || !strings.Contains(stderr, "RenewDeadline (13s) + RetryPeriod (2s) = 15s must be below") {
		t.Fatalf("renew deadline + retry period at the TTL: exit %d, stderr:\n%s", code, stderr)
	}

	stdout, stderr, code := run("-lease-duration", "3s", "-lead-for", "300ms")
	if code != 0 || !strings.Contains(stdout, "leading example-clientgo/x@1") || !strings.Contains(stdout, "stopped-leading") {
		t.Fatalf("-lease-duration 3s: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}
