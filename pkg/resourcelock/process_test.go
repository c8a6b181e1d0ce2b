package resourcelock_test

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

// buildExample builds examples/clientgo (client-go's RunOrDie over this
// package's Lock) into the test's temporary directory.
func buildExample(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "clientgo")
	start := time.Now()
	out, err := exec.Command(goBin, "build", "-o", bin, "github.com/pglease/pg_lease/examples/clientgo").CombinedOutput()
	if err != nil {
		t.Fatalf("go build examples/clientgo: %v\n%s", err, out)
	}
	t.Logf("built examples/clientgo in %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// procEvent is one line of the example's output.
type procEvent struct {
	id   string // the process
	kind string // epoch-start, leading, acting, epoch-end, stopped-leading, exit
	tok  lease.Token
	at   time.Time // the process's wall clock when it printed the line
}

type exampleProc struct {
	id   string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited and its output was read
	err  error         // cmd.Wait's error, set before done closes
}

func (p *exampleProc) wait() error {
	<-p.done
	return p.err
}

func parseToken(s string) lease.Token {
	at := strings.LastIndexByte(s, '@')
	slash := strings.IndexByte(s, '/')
	if at < 0 || slash < 0 || slash > at {
		return lease.Token{}
	}
	e, _ := strconv.ParseInt(s[at+1:], 10, 64)
	return lease.Token{Key: s[:slash], Owner: s[slash+1 : at], Epoch: e}
}

func startExample(t *testing.T, bin, dsn, key, id string, events chan<- procEvent) *exampleProc {
	t.Helper()
	cmd := exec.Command(bin, "-dsn", dsn, "-key", key, "-id", id,
		"-lease-duration", testTTL.String(), "-renew-deadline", testRenewDeadline.String(),
		"-retry-period", testRetryPeriod.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = nil // client-go's klog lines: not needed
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &exampleProc{id: id, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, f[0])
			if err != nil {
				continue
			}
			ev := procEvent{id: id, kind: f[1], at: at}
			if len(f) > 2 {
				ev.tok = parseToken(f[2])
			}
			events <- ev
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = p.wait()
	})
	return p
}

// Three OS processes run examples/clientgo (client-go's RunOrDie) on one key.
// The leader is SIGKILLed: another takes over once the grant lapses, with
// exactly the next epoch. That leader gets SIGTERM: it ends its term and
// releases, and the last process takes over at epoch + 2 (no lapse waited
// for). Across all processes, every epoch is started by one process only,
// epochs increase in time, and a term starts only after the previous
// leader's term ended (its epoch-end line) or its process was killed.
func TestProcessesClientGoExample(t *testing.T) {
	dsn := newDB(t)
	bin := buildExample(t)
	const key = "processes"
	events := make(chan procEvent, 1000)
	procs := map[string]*exampleProc{}
	for _, id := range []string{"p1", "p2", "p3"} {
		procs[id] = startExample(t, bin, dsn, key, id, events)
	}

	log := pgtest.NewEvents(events)
	wait := func(what string, match func(procEvent) bool) procEvent {
		t.Helper()
		return log.Await(t, 2*time.Minute, what, match)
	}

	first := wait("a first leader", func(e procEvent) bool { return e.kind == "leading" })
	t.Logf("%s leads %v", first.id, first.tok)
	killed := time.Now()
	if err := procs[first.id].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = procs[first.id].wait()
	second := wait("a takeover", func(e procEvent) bool { return e.kind == "epoch-start" })
	t.Logf("SIGKILL of %s → %s took over %v in %v (TTL %v, RetryPeriod %v)", first.id, second.id, second.tok,
		second.at.Sub(killed).Round(time.Millisecond), testTTL, testRetryPeriod)
	if second.id == first.id || second.tok.Epoch != first.tok.Epoch+1 {
		t.Fatalf("takeover %+v after %+v: want another process at epoch %d", second, first, first.tok.Epoch+1)
	}

	var third string
	for id := range procs {
		if id != first.id && id != second.id {
			third = id
		}
	}
	termed := time.Now()
	if err := procs[second.id].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var end, next procEvent
	wait("the end of the second term and a handoff", func(e procEvent) bool {
		switch {
		case e.kind == "epoch-end" && e.id == second.id:
			end = e
		case e.kind == "epoch-start":
			next = e
		}
		return end.id != "" && next.id != ""
	})
	t.Logf("SIGTERM of %s → %s took over %v in %v", second.id, next.id, next.tok, next.at.Sub(termed).Round(time.Millisecond))
	if next.id != third || next.tok.Epoch != second.tok.Epoch+2 {
		t.Fatalf("handoff %+v after %+v: want %s at epoch %d (release, then grant)", next, second, third, second.tok.Epoch+2)
	}
	if next.at.Before(end.at) {
		t.Fatalf("%s started %v at %v, before %s's term ended at %v", next.id, next.tok, next.at, second.id, end.at)
	}
	if err := procs[second.id].wait(); err != nil {
		t.Fatalf("%s after SIGTERM: %v", second.id, err)
	}

	if err := procs[third].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wait("the last leader to stop", func(e procEvent) bool { return e.kind == "stopped-leading" && e.id == third })
	if err := procs[third].wait(); err != nil {
		t.Fatalf("%s after SIGTERM: %v", third, err)
	}
	s, err := newClient(t, dsn).Inspect(context.Background(), key)
	if err != nil || s.Held || s.Epoch != next.tok.Epoch+1 {
		t.Fatalf("after the last leader stopped: %+v %v, want released", s, err)
	}

	// Across processes: one process per epoch, increasing in time.
	owner := map[int64]string{}
	var lastEpoch int64
	var lastAt time.Time
	for _, ev := range log.Seen() {
		if ev.kind != "epoch-start" {
			continue
		}
		if o, dup := owner[ev.tok.Epoch]; dup {
			t.Errorf("epoch %d started by %s and %s", ev.tok.Epoch, o, ev.id)
		}
		owner[ev.tok.Epoch] = ev.id
		if ev.tok.Epoch <= lastEpoch || ev.at.Before(lastAt) {
			t.Errorf("epoch %d at %v after epoch %d at %v", ev.tok.Epoch, ev.at, lastEpoch, lastAt)
		}
		lastEpoch, lastAt = ev.tok.Epoch, ev.at
	}
}
