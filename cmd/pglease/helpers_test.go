package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The tests drive pglease as a user does: arguments, environment, exit
// status, stdout and stderr. By default in-process (run); with
// PGLEASE_TEST_BINARY=path they run that binary instead (used to show that
// each test fails on the old command: build it from an older commit).
const envBinary = "PGLEASE_TEST_BINARY"

// syncBuffer is a bytes.Buffer safe for concurrent writers and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testCtx(t *testing.T) context.Context { return pgtest.Context(t, 3*time.Minute) }

// env is the environment of one invocation: PGLEASE_DSN and friends.
type env map[string]string

func dsnEnv(dsn string) env { return env{"PGLEASE_DSN": dsn} }

// proc is a running pglease.
type proc struct {
	out, err syncBuffer
	done     chan int
	stop     func() // interrupt (SIGTERM for a binary)
}

func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-p.done:
		return code
	case <-time.After(2 * time.Minute):
		t.Fatalf("pglease did not exit\nstdout: %s\nstderr: %s", p.out.String(), p.err.String())
		return -1
	}
}

// waitFor waits until stdout (or stderr, when inErr) contains what.
func (p *proc) waitFor(t *testing.T, what string, inErr bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		s := p.out.String()
		if inErr {
			s = p.err.String()
		}
		if strings.Contains(s, what) {
			return
		}
		select {
		case code := <-p.done:
			p.done <- code
			t.Fatalf("pglease exited %d before printing %q\nstdout: %s\nstderr: %s", code, what, p.out.String(), p.err.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pglease never printed %q\nstdout: %s\nstderr: %s", what, p.out.String(), p.err.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// start runs pglease with args and e, without waiting.
func start(t *testing.T, ctx context.Context, e env, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan int, 1)}
	if bin := binary(t); bin != "" {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "PGCONNECT_TIMEOUT=10"}
		for k, v := range e {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdout, cmd.Stderr = &p.out, &p.err
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p.stop = func() { _ = cmd.Process.Signal(syscall.SIGTERM) }
		go func() {
			_ = cmd.Wait()
			p.done <- cmd.ProcessState.ExitCode()
		}()
		return p
	}
	rctx, cancel := context.WithCancel(ctx)
	p.stop = cancel
	go func() {
		defer cancel()
		p.done <- run(rctx, args, &p.out, &p.err, func(k string) string { return e[k] })
	}()
	return p
}

// pglease runs pglease to its end: exit status, stdout, stderr.
func pglease(t *testing.T, ctx context.Context, e env, args ...string) (int, string, string) {
	t.Helper()
	p := start(t, ctx, e, args...)
	code := p.wait(t)
	return code, p.out.String(), p.err.String()
}

func mustRun(t *testing.T, ctx context.Context, e env, args ...string) string {
	t.Helper()
	code, out, errs := pglease(t, ctx, e, args...)
	if code != exitOK {
		t.Fatalf("pglease %q: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return out
}

func wantExit(t *testing.T, ctx context.Context, e env, want int, args ...string) (string, string) {
	t.Helper()
	code, out, errs := pglease(t, ctx, e, args...)
	if code != want {
		t.Fatalf("pglease %q: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errs)
	}
	return out, errs
}

// binary is the pglease binary the tests run, "" for in-process.
func binary(t *testing.T) string {
	if p := os.Getenv(envBinary); p != "" {
		return p
	}
	return ""
}

var built struct {
	mu    sync.Mutex
	paths map[string]string // by test
}

// buildBinary builds this command into the test's temporary directory
// (once per test; the build cache makes it a link) and returns its path.
func buildBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envBinary); p != "" {
		return p
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if p, ok := built.paths[t.Name()]; ok {
		return p
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	if _, err := os.Stat(goTool); err != nil {
		t.Fatalf("the go tool is needed to build pglease (install Go or put it on PATH): %v", err)
	}
	path := filepath.Join(t.TempDir(), "pglease")
	if out, err := exec.Command(goTool, "build", "-o", path, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if built.paths == nil {
		built.paths = map[string]string{}
	}
	built.paths[t.Name()] = path
	name := t.Name()
	t.Cleanup(func() {
		built.mu.Lock()
		delete(built.paths, name)
		built.mu.Unlock()
	})
	return path
}

// runBinary runs the built binary with exactly the environment e (plus PATH).
func runBinary(t *testing.T, ctx context.Context, e env, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, buildBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
	for k, v := range e {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	_ = cmd.Run()
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// leaseDB is a new database with pg_lease installed (pglease install).
func leaseDB(t *testing.T) string {
	t.Helper()
	dsn := freshDB(t)
	mustRun(t, testCtx(t), dsnEnv(dsn), "install")
	return dsn
}

// stopOK interrupts p and fails the test unless it exits 0 ("<what>: exit
// N" and its stderr).
func (p *proc) stopOK(t *testing.T, what string) {
	t.Helper()
	p.stop()
	if code := p.wait(t); code != exitOK {
		t.Fatalf("%s: exit %d: %s", what, code, p.err.String())
	}
}

// leaseSetup is how most tests begin: a context, a database with pg_lease
// installed by pglease itself (leaseDB), and a client on it.
func leaseSetup(t *testing.T) (context.Context, string, *lease.Client) {
	t.Helper()
	ctx := testCtx(t)
	dsn := leaseDB(t)
	_, c := connect(t, ctx, dsn)
	return ctx, dsn, c
}

// freshDB returns a DSN of a new database on the shared server, with the
// extension's files installed on that server but nothing in the database.
func freshDB(t *testing.T) string {
	t.Helper()
	if err := pgtest.Shared(t).InstallExtensionFiles(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return pgtest.NewDatabase(t)
}

func connect(t *testing.T, ctx context.Context, dsn string) (*pgx.Conn, *lease.Client) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, lease.New(conn)
}

func acquire(t *testing.T, ctx context.Context, c *lease.Client, key, owner string, ttl time.Duration) lease.Grant {
	t.Helper()
	g, ok, err := c.Acquire(ctx, key, owner, ttl)
	if err != nil || !ok {
		t.Fatalf("acquire %q for %q: ok=%v err=%v", key, owner, ok, err)
	}
	return g
}

// role creates a login role on the shared server, unique to the test.
func role(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if err := pgtest.Shared(t).CreateRole(ctx, name, "LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	return name
}

// tableRows splits table output into lines of cells (cells are separated by
// at least three spaces, the tabwriter padding).
func tableRows(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		var cells []string
		for _, c := range strings.Split(l, "   ") {
			if c = strings.TrimSpace(c); c != "" {
				cells = append(cells, c)
			}
		}
		rows = append(rows, cells)
	}
	return rows
}
