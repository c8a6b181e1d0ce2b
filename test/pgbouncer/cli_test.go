package pgbouncer

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// testCLI: pglease get, list, lock and watch through each pool mode. lock
// waits for a held key and runs once it is released (a notification in
// session pooling, its one-second poll in transaction pooling); watch shows
// a grant either way.
func testCLI(t *testing.T, s *setup) {
	bin := pgtest.BuildProgram(t, "github.com/pglease/pg_lease/cmd/pglease")
	s.forEachMode(t, func(t *testing.T, mode, dsn string) {
		ctx := pgtest.Context(t, 0)
		env := append(os.Environ(), "PGLEASE_DSN="+dsn)
		run := func(args ...string) string {
			t.Helper()
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("pglease %q through %s pooling: %v\n%s", args, mode, err, out)
			}
			return string(out)
		}
		key := "cli-" + mode
		if out := run("lock", key, "--", "sh", "-c", `echo "epoch=$PGLEASE_EPOCH"`); out != "epoch=1\n" {
			t.Fatalf("lock: %q", out)
		}
		if out := run("get", key, "-o", "json"); !strings.Contains(out, `"epoch": 2`) && !strings.Contains(out, `"epoch":2`) {
			t.Fatalf("get -o json: %s", out)
		}
		if out := run("list"); !strings.Contains(out, key) {
			t.Fatalf("list: %s", out)
		}

		watch := start(t, ctx, bin, env, "watch", key)
		holder := s.directClient(t)
		g, ok, err := holder.Acquire(ctx, key, "holder", time.Hour)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		watch.waitFor(t, "holder=holder")

		lock := start(t, ctx, bin, env, "lock", key, "--", "sh", "-c", "echo ran")
		time.Sleep(time.Second) // lock has found the key held and waits
		if lock.output() != "" {
			t.Fatalf("lock ran while the key was held: %q", lock.output())
		}
		released := time.Now()
		if err := holder.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		lock.waitFor(t, "ran")
		t.Logf("%s pooling: pglease lock ran %s after the release", mode, ms(time.Since(released)))
		if err := lock.wait(); err != nil {
			t.Fatalf("lock: %v\n%s", err, lock.output())
		}
		watch.stop(t)
	})
}

type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func start(t *testing.T, ctx context.Context, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan error, 1)}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
	return p
}

func (p *proc) waitFor(t *testing.T, s string) {
	t.Helper()
	pgtest.Eventually(t, time.Minute, "pglease to print "+s, func() bool {
		select {
		case err := <-p.done:
			p.done <- err
			if !strings.Contains(p.output(), s) {
				t.Fatalf("%v exited (%v) without printing %q:\n%s", p.cmd.Args, err, s, p.output())
			}
		default:
		}
		return strings.Contains(p.output(), s)
	})
}

func (p *proc) wait() error {
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(time.Minute):
		return context.DeadlineExceeded
	}
}

func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.wait(); err != nil {
		t.Fatalf("%v: %v\n%s", p.cmd.Args, err, p.output())
	}
}
