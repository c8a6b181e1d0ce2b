package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// The command runs holding the key, sees the grant in its environment, and
// pglease exits with its status and releases the key.
func TestLockRunsTheCommandUnderTheLease(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	out, _ := wantExit(t, ctx, dsnEnv(dsn), 3, "lock", "job-42", "--owner", "me", "--",
		"sh", "-c", `echo "key=$PGLEASE_KEY owner=$PGLEASE_OWNER epoch=$PGLEASE_EPOCH"; exit 3`)
	if out != "key=job-42 owner=me epoch=1\n" {
		t.Fatalf("command saw %q", out)
	}
	s, err := c.Inspect(ctx, "job-42")
	if err != nil || s.Held || s.Epoch != 2 {
		t.Fatalf("after lock: %+v %v: want released (epoch counter 2)", s, err)
	}
	// A short --ttl without --grace: the default grace shrinks to ttl/3.
	if out, _ := wantExit(t, ctx, dsnEnv(dsn), 0, "lock", "job-42", "--ttl", "3s", "--", "echo", "short"); out != "short\n" {
		t.Fatalf("lock --ttl 3s: %q", out)
	}
	// The command's signal death: 128+N.
	wantExit(t, ctx, dsnEnv(dsn), 128+int(syscall.SIGKILL), "lock", "job-42", "--", "sh", "-c", "kill -9 $$")
	// A missing command: 127, and the key released.
	wantExit(t, ctx, dsnEnv(dsn), exitNoCommand, "lock", "job-42", "--", "/nonexistent/command")
	if s, _ := c.Inspect(ctx, "job-42"); s.Held {
		t.Fatalf("key held after a command that could not start: %+v", s)
	}
	// Held by another owner for the whole --timeout: 8, nothing run.
	acquire(t, ctx, c, "job-42", "other", time.Minute)
	out, errs := wantExit(t, ctx, dsnEnv(dsn), exitHeld, "lock", "job-42", "--timeout", "300ms", "--", "echo", "ran")
	if out != "" || !strings.Contains(errs, "held by another owner") {
		t.Fatalf("lock of a held key: %q %q", out, errs)
	}
}

// A lock waits for a held key and runs when the holder releases it.
func TestLockWaitsForTheKey(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	g := acquire(t, ctx, c, "job-42", "other", time.Minute)
	p := start(t, ctx, dsnEnv(dsn), "lock", "job-42", "--", "sh", "-c", `echo "ran epoch=$PGLEASE_EPOCH"`)
	time.Sleep(300 * time.Millisecond)
	if p.out.String() != "" {
		t.Fatalf("the command ran while another owner held the key: %q", p.out.String())
	}
	if err := c.Release(ctx, g.Token); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 || p.out.String() != "ran epoch=3\n" {
		t.Fatalf("lock after the release: exit %d, %q %q", code, p.out.String(), p.err.String())
	}
	// A holder that lets its grant lapse: the lock runs after the expiry.
	acquire(t, ctx, c, "job-42", "other", 500*time.Millisecond)
	out, _ := wantExit(t, ctx, dsnEnv(dsn), 0, "lock", "job-42", "--", "sh", "-c", `echo "ran epoch=$PGLEASE_EPOCH"`)
	if out != "ran epoch=6\n" {
		t.Fatalf("lock after a lapse: %q", out)
	}
}

// When the lease is lost the command's whole process group is stopped
// (SIGTERM; SIGKILL after --grace for one that ignores SIGTERM) and pglease
// exits 7.
func TestLockStopsTheCommandWhenTheLeaseIsLost(t *testing.T) {
	for _, tc := range []struct {
		name, script string
	}{
		{"sigterm", `echo "pid=$$"; sleep 600 & echo "child=$!"; wait`},
		{"ignores sigterm", `trap '' TERM; echo "pid=$$"; sleep 600 & echo "child=$!"; while :; do wait; done`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, dsn, c := leaseSetup(t)
			p := start(t, ctx, dsnEnv(dsn), "lock", "job-42", "--ttl", "3s", "--grace", "1s", "--", "sh", "-c", tc.script)
			p.waitFor(t, "child=", false)
			pids := pidsIn(t, p.out.String())
			if _, _, _, err := leaseadmin.ForceRelease(ctx, c, "job-42"); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != exitLost {
				t.Fatalf("lock after the lease was lost: exit %d, want %d\nstderr: %s", code, exitLost, p.err.String())
			}
			if !strings.Contains(p.err.String(), "lease lost") {
				t.Fatalf("stderr %q does not say the lease was lost", p.err.String())
			}
			waitGone(t, pids, p)
		})
	}
}

func pidsIn(t *testing.T, out string) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(out) {
		if _, v, ok := strings.Cut(f, "="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				pids = append(pids, n)
			}
		}
	}
	if len(pids) != 2 {
		t.Fatalf("command printed %q, want pid= and child=", out)
	}
	return pids
}

// zombie: exited, not yet reaped (by init, after its parent died).
func zombie(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
	if err != nil {
		return true // gone
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}

// SIGTERM to pglease stops the command (its status is the exit status) and
// releases the key. Needs the real process: run with the built binary.
func TestLockInterruptedReleases(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	t.Setenv(envBinary, buildBinaryOrEnv(t))
	p := start(t, ctx, dsnEnv(dsn), "lock", "job-42", "--", "sh", "-c", `echo started; exec sleep 600`)
	p.waitFor(t, "started", false)
	p.stop() // SIGTERM to pglease
	if code := p.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("interrupted lock: exit %d, want %d (the command's SIGTERM)\nstderr: %s", code, 128+int(syscall.SIGTERM), p.err.String())
	}
	if s, err := c.Inspect(ctx, "job-42"); err != nil || s.Held {
		t.Fatalf("after the interrupted lock: %+v %v: want released", s, err)
	}
}

func buildBinaryOrEnv(t *testing.T) string {
	if p := os.Getenv(envBinary); p != "" {
		return p
	}
	return buildBinary(t)
}

// When renewals cannot reach the server, the command is stopped by the end
// of the grant's certain validity (SIGTERM --grace before it), so it never
// runs while another owner could hold the key; pglease exits 7.
func TestLockStopsTheCommandWhenTheServerIsUnreachable(t *testing.T) {
	ctx := testCtx(t)
	srv := pgtest.New(t)
	if err := srv.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, dsnEnv(dsn), "install")
	p := start(t, ctx, dsnEnv(dsn), "lock", "job-42", "--ttl", "3s", "--grace", "1s", "--",
		"sh", "-c", `echo "pid=$$"; sleep 600 & echo "child=$!"; wait`)
	p.waitFor(t, "child=", false)
	pids := pidsIn(t, p.out.String())
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	if code := p.wait(t); code != exitLost {
		t.Fatalf("lock with a frozen server: exit %d, want %d\nstderr: %s", code, exitLost, p.err.String())
	}
	if !strings.Contains(p.err.String(), "could not renew before the grant's certain validity ran out") {
		t.Fatalf("stderr %q does not say why the command was stopped", p.err.String())
	}
	waitGone(t, pids, p)
}

// waitGone fails the test if a process of the command outlives pglease
// (SIGKILL is delivered asynchronously: the kernel gets a moment).
func waitGone(t *testing.T, pids []int, p *proc) {
	t.Helper()
	for _, pid := range pids {
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(pid, 0) == nil && !zombie(pid) {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				t.Errorf("process %d of the command still runs after pglease stopped it: %s\nstderr: %s", pid, b, p.err.String())
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// During the grace after a (simulated) promotion, lock sleeps until the grace
// ends, told by the denial, then runs the command: a few acquires in all
// (counted by the server, track_functions), where asking again whenever the
// key reads free made thousands.
func TestLockSleepsThroughGrace(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	conn, c := connect(t, ctx, dsn)
	// The SQL embedded in this build (no shared extension files).
	if err := leaseadmin.InstallSchema(ctx, conn); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"SELECT lease.configure(max_ttl => '3s')",
		"DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database()); END $$",
		// The promotion, as the SQL sees one: an older timeline recorded, the
		// rows written by the old primary's postmaster, and a checkpoint on the
		// server's (a promotion requests one at once).
		"UPDATE lease.timeline_state SET timeline = 0", "UPDATE lease.leases SET life = life - interval '1 day'", "CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := wantExit(t, ctx, dsnEnv(dsn), 0, "lock", "job", "--ttl", "3s", "--grace", "1s", "--", "echo", "ran")
	if out != "ran\n" {
		t.Fatalf("lock after the grace: %q", out)
	}
	var calls int64
	// The statistics of pglease's session are flushed when it exits.
	pgtest.Eventually(t, time.Minute, "pglease's acquire calls in pg_stat_user_functions", func() bool {
		err := conn.QueryRow(ctx, `SELECT coalesce(sum(f.calls), 0) FROM pg_stat_user_functions f
		    WHERE f.schemaname = 'lease' AND f.funcname = 'acquire'`).Scan(&calls)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		return calls > 0
	})
	t.Logf("%d acquires through a 3s grace", calls)
	// Granted in the new era (released since: its counter is one above).
	if st, err := c.Inspect(ctx, "job"); err != nil || st.Epoch != 1<<40+2 {
		t.Fatalf("after lock: %+v %v, want the grant of era 1 released", st, err)
	}
	if calls > 10 {
		t.Fatalf("%d acquires through a 3s grace: lock asked again instead of sleeping until its end", calls)
	}
}

// A change whose commit's wait for the synchronous standbys was cancelled
// exits 9, never 0: lock does not run the command on such a grant, and a
// forced release says the release may be lost. The server names a
// synchronous standby that never connects; every wait for it is cancelled.
func TestCommitUnknownExits9(t *testing.T) {
	ctx := testCtx(t)
	srv := pgtest.New(t)
	dsn := pgtest.NewLeaseDatabaseOn(t, srv)
	conn, c := connect(t, ctx, dsn)
	acquire(t, ctx, c, "held", "someone", time.Minute)
	var dbname string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	cancelled := pgtest.CancelSyncWaits(t, srv, dbname)

	out, errs := wantExit(t, ctx, dsnEnv(dsn), exitUnknown, "lock", "job", "--", "echo", "ran")
	if out != "" || !strings.Contains(errs, "commit not confirmed by the synchronous standbys") {
		t.Fatalf("lock on an unconfirmed grant: stdout %q (the command must not run), stderr %q", out, errs)
	}
	_, errs = wantExit(t, ctx, dsnEnv(dsn), exitUnknown, "release", "--force", "held")
	if !strings.Contains(errs, "commit not confirmed") {
		t.Fatalf("release --force unconfirmed: stderr %q", errs)
	}
	pgtest.Eventually(t, time.Minute, "a synchronous wait counted as cancelled per command", func() bool { return cancelled.Load() >= 2 })
}

// lock --timeout that ends during the grace after a (simulated) promotion
// exits 10 and says when the grace ends, not 8 (held by another owner): no
// other owner holds the key.
func TestLockTimeoutInGraceExits10(t *testing.T) {
	ctx := testCtx(t)
	dsn := leaseDB(t)
	conn, _ := connect(t, ctx, dsn)
	for _, q := range []string{
		"SELECT lease.configure(max_ttl => '1 min')",
		// The promotion, as the SQL sees one: an older timeline recorded, the
		// rows written by the old primary's postmaster, and a checkpoint on the
		// server's (a promotion requests one at once).
		"UPDATE lease.timeline_state SET timeline = 0", "UPDATE lease.leases SET life = life - interval '1 day'", "CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	out, errs := wantExit(t, ctx, dsnEnv(dsn), exitGrace, "lock", "job", "--timeout", "1s", "--", "echo", "ran")
	if out != "" || !strings.Contains(errs, "grace after a promotion") || !strings.Contains(errs, "pglease status") {
		t.Fatalf("lock timed out in the grace: stdout %q, stderr %q", out, errs)
	}
}
