package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"
)

// Controller-runtime's default leader election timings: LeaseDuration,
// RenewDeadline, RetryPeriod.
const (
	crLeaseDuration = 15 * time.Second
	crRenewDeadline = 10 * time.Second
	crRetryPeriod   = 2 * time.Second
)

// TestManagerHandoff runs examples/operator (a controller-runtime manager)
// as two replicas at controller-runtime's default timings (15s/10s/2s) on
// the real kube-apiserver, once on pg_lease and once on client-go's Lease
// lock, as a new user would run them: no option besides the lock. It stops
// the leader (SIGTERM: the manager releases on cancel), then kills the new
// leader (SIGKILL), and asserts only safety and order: the successor leads
// under a higher epoch each time, there are never two leaders, and the
// store accepted only writes of the epoch leading (env.verify). It REPORTS
// the handoff figures (t.Logf, one results line per lock, also
// appended to the file $PGLEASE_E2E_RESULTS when set): the handoff (SIGTERM
// to the successor's grant) and the takeover (SIGKILL to the successor's
// grant; for pg_lease also the grant's distance from the killed grant's
// expiry on the server). The numbers are for the benchmark
// (bench/handoff, docs/benchmarks.md); nothing here is a timed assertion.
func TestManagerHandoff(t *testing.T) {
	h := newHarness(t)
	var lines []string
	for _, lock := range []string{"pglease", "lease"} {
		t.Run(lock, func(t *testing.T) {
			e := h.newEnv(t, lock, lock+"-handoff")
			e.ld, e.rd, e.rp = crLeaseDuration, crRenewDeadline, crRetryPeriod
			lines = append(lines, handoffAndTakeover(e))
		})
	}
	t.Logf("controller-runtime defaults (%v/%v/%v), two replicas of examples/operator:\n%s",
		crLeaseDuration, crRenewDeadline, crRetryPeriod, strings.Join(lines, "\n"))
	if path := os.Getenv("PGLEASE_E2E_RESULTS"); path != "" && len(lines) > 0 {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := fmt.Fprintln(f, strings.Join(lines, "\n")); err != nil {
			t.Fatal(err)
		}
	}
}

// handoffAndTakeover runs the two stops on e and returns the results line.
// Processes are started one by one (no supervisor restarts them), so the
// successor is always the standby that was waiting.
func handoffAndTakeover(e *env) string {
	t := e.t
	w := e.startWorkload(3, 200*time.Millisecond)
	startOne := func(slot int) *opProc {
		p, err := e.start(slot)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	settle := func() {
		time.Sleep(time.Duration((1+leaderelection.JitterFactor)*float64(crRetryPeriod)) + time.Second)
	}
	p1 := startOne(1)
	l1 := e.awaitLeader(0, 30*time.Second, "")
	p2 := startOne(2)
	e.awaitReady(60*time.Second, 1, 2)
	e.awaitWrite(0, 30*time.Second, l1.ID, l1.Epoch, "")
	if l1.ID != p1.id {
		t.Fatalf("first leader %s, want %s (the only candidate then)", l1.ID, p1.id)
	}
	// Let the standby settle into its follower loop (for pg_lease: a Get
	// waiting for news; for the Lease: polling every RetryPeriod). Its
	// first Get never waits; client-go calls the second one a jittered
	// RetryPeriod later (at most (1 + JitterFactor) × RetryPeriod): from
	// then on it waits.
	settle()

	// Handoff: SIGTERM the leader.
	m := e.mark()
	stopped := e.signal(p1, syscall.SIGTERM)
	l2 := e.awaitLeader(m, 3*crLeaseDuration, l1.ID)
	handoff := l2.Time.Sub(stopped)
	var released time.Time
	for _, ev := range e.allEvents()[m:] {
		if ev.ID == l1.ID && ev.Event == "epoch-end" && ev.Epoch == l1.Epoch {
			released = ev.Time
			break
		}
	}
	if l2.ID != p2.id || l2.Epoch <= l1.Epoch {
		t.Errorf("handoff: %s@%d leads after %s@%d, want the standby %s under a higher epoch", l2.ID, l2.Epoch, l1.ID, l1.Epoch, p2.id)
	}
	if released.IsZero() {
		t.Errorf("handoff: the stopped leader %s reported no end of epoch %d", l1.ID, l1.Epoch)
	} else if l2.Time.Before(released) {
		t.Errorf("handoff: %s@%d started at %s, before %s@%d ended at %s", l2.ID, l2.Epoch, l2.Time.Format("15:04:05.000"),
			l1.ID, l1.Epoch, released.Format("15:04:05.000"))
	}
	afterEnd := "n/a"
	if !released.IsZero() {
		afterEnd = fmt.Sprintf("%.1f", float64(l2.Time.Sub(released).Microseconds())/1000)
	}
	t.Logf("handoff: SIGTERM to %s@%d at %s; %s granted epoch %d at %s: %v after the signal, %s ms after the old term ended",
		l1.ID, l1.Epoch, stopped.Format("15:04:05.000"), l2.ID, l2.Epoch, l2.Time.Format("15:04:05.000"),
		handoff.Round(100*time.Microsecond), afterEnd)
	e.awaitExit(p1, 30*time.Second)
	e.awaitWrite(m, 30*time.Second, l2.ID, l2.Epoch, "")

	// Takeover: a new standby (a new pod); once it follows, SIGKILL the
	// leader.
	p3 := startOne(3)
	e.awaitReady(60*time.Second, 2, 3)
	settle()
	if got := e.leader(); got.id != l2.ID || got.epoch != l2.Epoch {
		t.Fatalf("leader changed before the kill: %v, want %s@%d", got, l2.ID, l2.Epoch)
	}
	m = e.mark()
	killed := e.signal(p2, syscall.SIGKILL)
	l3 := e.awaitLeader(m, 3*crLeaseDuration, l2.ID)
	takeover := l3.Time.Sub(killed)
	if l3.ID != p3.id || l3.Epoch <= l2.Epoch {
		t.Errorf("takeover: %s@%d leads after %s@%d, want the standby %s under a higher epoch", l3.ID, l3.Epoch, l2.ID, l2.Epoch, p3.id)
	}
	expiry := "n/a"
	if e.lock == "pglease" {
		// The server's expiry of the killed leader's grant: the last one
		// the sampler saw for its epoch.
		var exp time.Time
		for _, s := range e.allSamples() {
			if s.held && s.owner == l2.ID && s.epoch == l2.Epoch {
				exp = s.expiresAt
			}
		}
		if exp.IsZero() {
			t.Errorf("takeover: no sample of %s@%d's grant", l2.ID, l2.Epoch)
		} else {
			expiry = fmt.Sprintf("%.1f", float64(l3.Time.Sub(exp).Microseconds())/1000)
		}
	}
	t.Logf("takeover: SIGKILL to %s@%d at %s; %s granted epoch %d at %s: %v after the kill, %s ms after the grant's server expiry (last sampled)",
		l2.ID, l2.Epoch, killed.Format("15:04:05.000"), l3.ID, l3.Epoch, l3.Time.Format("15:04:05.000"),
		takeover.Round(100*time.Microsecond), expiry)
	e.awaitWrite(m, 30*time.Second, l3.ID, l3.Epoch, "")
	e.verify(w)
	if t.Failed() {
		for _, p := range []*opProc{p1, p2, p3} {
			t.Logf("%s's log (tail):\n%s", p.id, tail(p.log))
		}
	}
	line := fmt.Sprintf("RESULT e2e-manager-handoff lock=%s ld=%v rd=%v rp=%v handoff_ms=%.1f handoff_after_term_end_ms=%s takeover_ms=%.1f takeover_after_server_expiry_ms=%s",
		e.lock, crLeaseDuration, crRenewDeadline, crRetryPeriod, float64(handoff.Microseconds())/1000, afterEnd,
		float64(takeover.Microseconds())/1000, expiry)
	t.Log(line)
	return line
}
