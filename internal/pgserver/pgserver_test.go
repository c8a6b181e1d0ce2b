package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	pgleasesql "github.com/pglease/pg_lease/sql"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := CloseShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newServer starts a throwaway server closed at cleanup (what pgtest.New
// does; pgtest imports this package).
func newServer(t *testing.T, opts ...Options) *Server {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s, err := Start(ctxFor(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func sharedFor(t *testing.T) *Server {
	t.Helper()
	s, err := Shared(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxFor(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec1(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctxFor(t), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestStartConnect(t *testing.T) {
	s := newServer(t, Options{Settings: map[string]string{"max_connections": "20", "synchronous_commit": "off"}})
	if s.MajorVersion() < 10 {
		t.Fatalf("MajorVersion = %d (%s)", s.MajorVersion(), s.Version())
	}
	t.Logf("%s in %s, port %d", s.Version(), s.BinDir(), s.Port())
	for _, dsn := range []string{s.DSN(), s.SocketDSN("postgres")} {
		conn := connect(t, dsn)
		var user, maxConn, syncCommit string
		if err := conn.QueryRow(ctxFor(t), "SELECT current_user, current_setting('max_connections'), current_setting('synchronous_commit')").
			Scan(&user, &maxConn, &syncCommit); err != nil {
			t.Fatal(err)
		}
		if user != Superuser || maxConn != "20" || syncCommit != "off" {
			t.Fatalf("user %q max_connections %q synchronous_commit %q", user, maxConn, syncCommit)
		}
	}
	if os.Geteuid() == 0 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(s.PID()) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "Uid:") && strings.Fields(line)[1] == "0" {
				t.Fatalf("postmaster runs as root: %s", line)
			}
		}
	}
	dsn, err := s.NewDatabase(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, connect(t, dsn), "CREATE TABLE t (x int)")

	if err := s.CreateRole(ctxFor(t), "app", "LOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	var user string
	if err := connect(t, WithUser(dsn, "app")).QueryRow(ctxFor(t), "SELECT current_user").Scan(&user); err != nil || user != "app" {
		t.Fatalf("current_user %q, %v", user, err)
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, o := range []Options{
		{Settings: map[string]string{"port": "5432"}},
		{Settings: map[string]string{"bad name": "1"}},
		{Settings: map[string]string{"work_mem": "1\n2"}},
		{StartTimeout: -1},
	} {
		if s, err := Start(context.Background(), o); err == nil {
			s.Close()
			t.Errorf("Start(%+v) succeeded", o)
		}
	}
}

func TestNoBinaries(t *testing.T) {
	t.Setenv(EnvBinDir, t.TempDir())
	_, err := Start(context.Background(), Options{})
	if err == nil || !strings.Contains(err.Error(), EnvBinDir) {
		t.Fatalf("err = %v", err)
	}
	// The message for no installation at all names the package to install.
	if !strings.Contains(errNoBinaries.Error(), "no PostgreSQL") {
		t.Fatal(errNoBinaries)
	}
}

func TestKillKeepsCommittedData(t *testing.T) {
	s := newServer(t)
	ctx := ctxFor(t)
	conn := connect(t, s.DSN())
	exec1(t, conn, "CREATE TABLE kv (k text PRIMARY KEY, v int)")
	exec1(t, conn, "INSERT INTO kv VALUES ('committed', 1)")
	open := connect(t, s.DSN())
	exec1(t, open, "BEGIN")
	exec1(t, open, "INSERT INTO kv VALUES ('uncommitted', 2)")

	pid := s.PID()
	kids := children(pid)
	if len(kids) < 3 {
		t.Fatalf("postmaster %d has children %v", pid, kids)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("running after Kill")
	}
	for _, p := range append(kids, pid) {
		if alive(p) {
			t.Fatalf("process %d alive after Kill", p)
		}
	}
	if _, err := os.Stat(filepath.Join(s.DataDir(), "postmaster.pid")); err != nil {
		t.Fatalf("postmaster.pid gone after SIGKILL (not a crash?): %v", err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Log(), "not properly shut down") {
		t.Errorf("no crash recovery in the log:\n%s", s.Log())
	}
	rows, err := connect(t, s.DSN()).Query(ctx, "SELECT k FROM kv ORDER BY k")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(keys) != 1 || keys[0] != "committed" {
		t.Fatalf("after crash: %v, %v", keys, err)
	}
	// Kill twice and Kill of a killed server are harmless.
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStopStartRestart(t *testing.T) {
	s := newServer(t)
	ctx := ctxFor(t)
	conn := connect(t, s.DSN())
	exec1(t, conn, "CREATE TABLE t AS SELECT 7 AS x")
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.DataDir(), "postmaster.pid")); !os.IsNotExist(err) {
		t.Fatalf("postmaster.pid after Stop: %v", err)
	}
	if c, err := pgx.Connect(ctx, s.DSN()); err == nil {
		c.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("Start of a running server succeeded")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var x int
	if err := connect(t, s.DSN()).QueryRow(ctx, "SELECT x FROM t").Scan(&x); err != nil || x != 7 {
		t.Fatalf("x = %d, %v", x, err)
	}
	if strings.Contains(s.Log(), "not properly shut down") {
		t.Error("crash recovery after a clean stop")
	}
}

func TestFreezeThaw(t *testing.T) {
	s := newServer(t)
	ctx := ctxFor(t)
	timed := connect(t, s.DSN())
	pending := connect(t, s.DSN())
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := timed.Exec(short, "SELECT 1"); !errors.Is(err, context.DeadlineExceeded) && !pgconnTimeout(err) {
		t.Fatalf("query on a frozen server: %v", err)
	}
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		var n int
		err := pending.QueryRow(ctx, "SELECT 42").Scan(&n)
		res <- result{n, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("query completed on a frozen server: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	if err := s.Thaw(); err != nil {
		t.Fatal(err)
	}
	if r := <-res; r.err != nil || r.n != 42 {
		t.Fatalf("after Thaw: %+v", r)
	}
	// Stop and Close work on a frozen server.
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
}

func pgconnTimeout(err error) bool {
	return err != nil && strings.Contains(err.Error(), "timeout")
}

func TestSetClockOffset(t *testing.T) {
	s := newServer(t, Options{FakeClock: true})
	conn := connect(t, s.DSN())
	skew := func() time.Duration {
		t.Helper()
		var ts time.Time
		before := time.Now()
		if err := conn.QueryRow(ctxFor(t), "SELECT clock_timestamp()").Scan(&ts); err != nil {
			t.Fatal(err)
		}
		return ts.Sub(before)
	}
	near := func(got, want, tol time.Duration) bool { return got > want-tol && got < want+tol }
	if d := skew(); !near(d, 0, 2*time.Second) {
		t.Fatalf("initial skew %v", d)
	}
	for _, off := range []time.Duration{time.Hour, -10 * time.Minute, 30 * time.Second, 1500 * time.Millisecond, 0} {
		if err := s.SetClockOffset(off); err != nil {
			t.Fatal(err)
		}
		if d := skew(); !near(d, off, 500*time.Millisecond) {
			t.Fatalf("offset %v: server clock is %v from ours", off, d)
		}
	}
	// now() too, in new backends and after a restart.
	if err := s.SetClockOffset(-time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	var ts time.Time
	if err := connect(t, s.DSN()).QueryRow(ctxFor(t), "SELECT now()").Scan(&ts); err != nil {
		t.Fatal(err)
	}
	if d := time.Until(ts); !near(d, -time.Hour, 2*time.Second) {
		t.Fatalf("now() after restart is %v from ours", d)
	}

	plain := newServer(t)
	if err := plain.SetClockOffset(time.Second); err == nil {
		t.Fatal("SetClockOffset without FakeClock succeeded")
	}
}

func TestFormatOffset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Second:        "+30",
		-10 * time.Second:       "-10",
		0:                       "+0",
		1500 * time.Millisecond: "+1.500000000",
		-time.Millisecond:       "-0.001000000",
	} {
		if got := formatOffset(d); got != want {
			t.Errorf("formatOffset(%v) = %q, want %q", d, got, want)
		}
	}
}

// leftovers describes what a server owns that Close must remove.
type leftovers struct {
	pids []int
	shm  shmSeg
	root string
}

func snapshot(t *testing.T, s *Server) leftovers {
	t.Helper()
	pf, ok := readPidFile(s.DataDir())
	if !ok || pf.shm.id < 0 || !shmExists(pf.shm.id) {
		t.Fatalf("no shared-memory segment in postmaster.pid: %+v %v", pf, ok)
	}
	return leftovers{pids: append(children(s.PID()), s.PID()), shm: pf.shm, root: filepath.Dir(s.DataDir())}
}

func (l leftovers) check(t *testing.T) {
	t.Helper()
	for _, p := range l.pids {
		if alive(p) {
			t.Errorf("process %d still alive", p)
		}
	}
	// Backends are orphaned when the postmaster dies; their exit status
	// goes to pid 1 (or a subreaper), which reaps them on its own schedule.
	// The postmaster is this process's child and must be reaped by it.
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range l.pids {
		for {
			ppid, state, ok := procStat(p)
			if !ok {
				break
			}
			if ppid == os.Getpid() && state == 'Z' {
				if time.Now().After(deadline) {
					t.Errorf("process %d is this process's unreaped child", p)
					break
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			break // a dead orphan: its new parent reaps it
		}
	}
	if _, err := os.Stat(l.root); !os.IsNotExist(err) {
		t.Errorf("directory %s: %v", l.root, err)
	}
	// Removed, or marked for removal while an orphaned backend that has not
	// yet noticed its postmaster's death is still attached: wait for it.
	for deadline := time.Now().Add(10 * time.Second); shmExists(l.shm.id); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("shared-memory segment %d still exists", l.shm.id)
			break
		}
	}
	if out, err := exec.Command("ipcs", "-m").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[1] == strconv.FormatInt(l.shm.id, 10) {
				t.Errorf("ipcs -m lists segment %d: %s", l.shm.id, line)
			}
		}
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	t.Run("running", func(t *testing.T) {
		s, err := Start(ctxFor(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		connect(t, s.DSN()) // a backend too
		l := snapshot(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		l.check(t)
	})
	t.Run("killed", func(t *testing.T) {
		s, err := Start(ctxFor(t), Options{FakeClock: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l := snapshot(t, s)
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
		if !shmExists(l.shm.id) {
			t.Log("segment already gone after Kill")
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		l.check(t)
	})
	t.Run("frozen", func(t *testing.T) {
		s, err := Start(ctxFor(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l := snapshot(t, s)
		if err := s.Freeze(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		l.check(t)
	})
}

// TestSweepStale: what a test process that died left behind (a running
// postmaster, its segment and directory) is removed by the next Start.
func TestSweepStale(t *testing.T) {
	parent := t.TempDir()
	if os.Geteuid() == 0 {
		// t.TempDir's directories are 0700: let the server's user in.
		for _, d := range []string{parent, filepath.Dir(parent)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := Start(ctxFor(t), Options{Dir: parent})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := snapshot(t, s)
	// Pretend the owner died: a pid that cannot exist.
	if err := os.WriteFile(filepath.Join(l.root, ownerFile), []byte("2147483647 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Detach the Server from the postmaster as a dead process would.
	sweepStale(parent)
	<-s.done
	l.check(t)
}

func TestInstallExtensionFiles(t *testing.T) {
	s := sharedFor(t)
	ctx := ctxFor(t)
	if err := s.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	if s.External() {
		return // it only checked that the server offers pg_lease
	}
	dir, err := s.ExtensionDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	files := pgleasesql.Files()
	if len(files) < 2 {
		t.Fatalf("pgleasesql.Files() = %d files", len(files))
	}
	mtimes := map[string]time.Time{}
	for name, want := range files {
		p := filepath.Join(dir, name)
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: differs or missing (%v)", p, err)
		}
		fi, _ := os.Stat(p)
		mtimes[name] = fi.ModTime()
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	for name, mt := range mtimes {
		if fi, _ := os.Stat(filepath.Join(dir, name)); !fi.ModTime().Equal(mt) {
			t.Errorf("%s rewritten although unchanged", name)
		}
	}
	var version string
	err = connect(t, s.DSN()).QueryRow(ctx,
		"SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease'").Scan(&version)
	if err != nil || version != pgleasesql.Version {
		t.Fatalf("pg_available_extensions.default_version: %q, %v", version, err)
	}
}

// TestExtensionDirWithoutPgConfig: installations without pg_config (the
// npm-packaged servers) are asked for their share directory over SQL.
func TestExtensionDirWithoutPgConfig(t *testing.T) {
	real, err := FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	want, err := exec.Command(filepath.Join(real, "pg_config"), "--sharedir").Output()
	if err != nil {
		t.Fatalf("this test compares with pg_config, which %s lacks (%v): run it with Debian's server binaries (apt-get install postgresql-15), not PGLEASE_PG_BINDIR", real, err)
	}
	bin := t.TempDir()
	if os.Geteuid() == 0 {
		for _, d := range []string{bin, filepath.Dir(bin)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, name := range []string{"initdb", "postgres"} {
		if err := os.Symlink(filepath.Join(real, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	s := newServer(t, Options{BinDir: bin})
	got, err := s.ExtensionDir(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if w := filepath.Join(strings.TrimSpace(string(want)), "extension"); got != w {
		t.Fatalf("ExtensionDir = %q, want %q", got, w)
	}
}

func TestInstallFilesRewritesOnlyChanged(t *testing.T) {
	dir := t.TempDir()
	if err := InstallFiles(dir, map[string][]byte{"a": []byte("1"), "b": []byte("2")}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(filepath.Join(dir, "a"))
	time.Sleep(20 * time.Millisecond)
	if err := InstallFiles(dir, map[string][]byte{"a": []byte("1"), "b": []byte("3")}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(dir, "a"))
	if !after.ModTime().Equal(before.ModTime()) {
		t.Error("unchanged file rewritten")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "b")); string(b) != "3" {
		t.Errorf("b = %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("temporary files left: %v", entries)
	}
	if err := InstallFiles(dir, map[string][]byte{"../x": nil}); err == nil {
		t.Error("path accepted")
	}
}

func TestExternal(t *testing.T) {
	own := newServer(t)
	ctx := ctxFor(t)
	for _, dsn := range []string{own.DSN(), "host=127.0.0.1 port=" + strconv.Itoa(own.Port()) + " user=postgres dbname=postgres sslmode=disable"} {
		ext, err := External(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if ext.MajorVersion() != own.MajorVersion() || ext.User() != Superuser {
			t.Fatalf("external: major %d user %q", ext.MajorVersion(), ext.User())
		}
		db, err := ext.NewDatabase(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec1(t, connect(t, db), "CREATE TABLE t (x int)")
		err = ext.Kill()
		if !errors.Is(err, ErrNeedsThrowaway) || !strings.Contains(err.Error(), EnvTestDSN) {
			t.Fatalf("Kill on external: %v", err)
		}
		if err := ext.Start(ctx); !errors.Is(err, ErrNeedsThrowaway) {
			t.Fatalf("Start on external: %v", err)
		}
		var n int
		conn := connect(t, own.DSN())
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname LIKE 'pgtest\\_%'").Scan(&n); err != nil || n != 1 {
			t.Fatalf("databases before Close: %d, %v", n, err)
		}
		if err := ext.Close(); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname LIKE 'pgtest\\_%'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("databases after Close: %d, %v", n, err)
		}
	}
}

// TestOwnerDeath: when the test process dies without cleaning up, the
// kernel kills its postmaster (parent-death signal), and the next Start in
// the same parent directory removes the directory and segment it left.
func TestOwnerDeath(t *testing.T) {
	if dir := os.Getenv("PGTEST_ABANDON_DIR"); dir != "" {
		s, err := Start(context.Background(), Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		pf, _ := readPidFile(s.DataDir())
		os.Stdout.WriteString("ABANDON " + filepath.Dir(s.DataDir()) + " " + strconv.Itoa(pf.pid) + " " + strconv.FormatInt(pf.shm.key, 10) + " " + strconv.FormatInt(pf.shm.id, 10) + "\n")
		os.Exit(0) // no Close, no cleanup
	}
	parent := t.TempDir()
	if os.Geteuid() == 0 {
		for _, d := range []string{parent, filepath.Dir(parent)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOwnerDeath$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_ABANDON_DIR="+parent)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var l leftovers
	var pid int
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 5 && f[0] == "ABANDON" {
			l.root = f[1]
			pid, _ = strconv.Atoi(f[2])
			l.shm.key, _ = strconv.ParseInt(f[3], 10, 64)
			l.shm.id, _ = strconv.ParseInt(f[4], 10, 64)
		}
	}
	if l.root == "" || pid == 0 {
		t.Fatalf("helper output:\n%s", out)
	}
	l.pids = []int{pid}
	if err := waitGone([]int{pid}, 10*time.Second); err != nil {
		t.Fatalf("postmaster outlived its owner: %v", err)
	}
	if _, err := os.Stat(l.root); err != nil {
		t.Fatalf("abandoned directory: %v", err)
	}
	sweepStale(parent)
	l.check(t)
}
