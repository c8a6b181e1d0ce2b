package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"sigs.k8s.io/yaml"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
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

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// freshDB returns a DSN of a new database on the shared server, with the
// extension's files installed on that server but nothing in the database.
func freshDB(t *testing.T) string {
	t.Helper()
	ctx := testCtx(t)
	if err := pgtest.Shared(t).InstallExtensionFiles(ctx); err != nil {
		t.Fatal(err)
	}
	return pgtest.NewDatabase(t)
}

// pglease runs the command in-process with --dsn and returns its exit code,
// stdout and stderr.
func pglease(t *testing.T, ctx context.Context, dsn string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer
	code := run(ctx, append([]string{"--dsn", dsn}, args...), &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

func mustRun(t *testing.T, ctx context.Context, dsn string, args ...string) string {
	t.Helper()
	code, out, errs := pglease(t, ctx, dsn, args...)
	if code != exitOK {
		t.Fatalf("pglease %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return out
}

func connect(t *testing.T, ctx context.Context, dsn string) *lease.Client {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return lease.New(conn)
}

func TestInstallBothModesAndVersion(t *testing.T) {
	for _, mode := range []struct {
		args []string
		want string
	}{{[]string{"install"}, "(extension)"}, {[]string{"install", "--schema-only"}, "(schema)"}} {
		t.Run(strings.Join(mode.args, " "), func(t *testing.T) {
			ctx := testCtx(t)
			dsn := freshDB(t)
			// Before install: a clear error and its own exit code.
			code, _, errs := pglease(t, ctx, dsn, "list")
			if code != exitNotInstalled || !strings.Contains(errs, "not installed") || !strings.Contains(errs, "pglease install") {
				t.Fatalf("list before install: exit %d, stderr %q; want exit %d naming the fix", code, errs, exitNotInstalled)
			}
			out := mustRun(t, ctx, dsn, mode.args...)
			if !strings.Contains(out, "pg_lease "+lease.Version+" installed "+mode.want) {
				t.Fatalf("install output %q", out)
			}
			// Idempotent.
			mustRun(t, ctx, dsn, mode.args...)
			out = mustRun(t, ctx, dsn, "version")
			for _, want := range []string{"client:  " + lease.Version, "sql:     " + lease.Version + " " + mode.want, "server:  PostgreSQL "} {
				if !strings.Contains(out, want) {
					t.Fatalf("version output %q lacks %q", out, want)
				}
			}
		})
	}
}

func TestGetListFormats(t *testing.T) {
	ctx := testCtx(t)
	dsn := freshDB(t)
	mustRun(t, ctx, dsn, "install")
	c := connect(t, ctx, dsn)
	g, ok, err := c.Acquire(ctx, "job-42", "worker-a1", time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if _, ok, err := c.Acquire(ctx, "job-43", "worker-b2", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := c.Release(ctx, lease.Token{Key: "job-43", Owner: "worker-b2", Epoch: 1}); err != nil {
		t.Fatal(err)
	}

	out := mustRun(t, ctx, dsn, "get", "job-42")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "KEY") || !strings.Contains(lines[0], "REMAINING") {
		t.Fatalf("get table: %q", out)
	}
	if f := strings.Fields(lines[1]); f[0] != "job-42" || f[1] != "worker-a1" || f[2] != "1" {
		t.Fatalf("get row: %q", lines[1])
	}

	var one row
	if err := json.Unmarshal([]byte(mustRun(t, ctx, dsn, "get", "job-42", "-o", "json")), &one); err != nil {
		t.Fatal(err)
	}
	if !one.Held || one.Holder != "worker-a1" || one.Epoch != g.Epoch || one.ExpiresAt == nil || !one.ExpiresAt.Equal(g.ExpiresAt) {
		t.Fatalf("get -o json: %+v, grant %+v", one, g)
	}

	var all []row
	if err := yaml.Unmarshal([]byte(mustRun(t, ctx, dsn, "list", "-o", "yaml")), &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Key != "job-42" || !all[0].Held || all[1].Key != "job-43" || all[1].Held || all[1].Epoch != 2 || all[1].Holder != "" {
		t.Fatalf("list -o yaml: %+v", all)
	}
	out = mustRun(t, ctx, dsn, "list")
	if !strings.Contains(out, "job-43") || !strings.Contains(out, "<none>") {
		t.Fatalf("list table: %q", out)
	}

	// A never-leased key, a bad key, a bad format: distinct exit codes.
	if code, _, errs := pglease(t, ctx, dsn, "get", "nope"); code != exitNotFound || !strings.Contains(errs, "never leased") {
		t.Fatalf("get never-leased: exit %d %q", code, errs)
	}
	if code, _, errs := pglease(t, ctx, dsn, "get", ""); code != exitUsage || !strings.Contains(errs, "invalid key") {
		t.Fatalf("get empty key: exit %d %q", code, errs)
	}
	if code, _, errs := pglease(t, ctx, dsn, "get", strings.Repeat("k", 1025)); code != exitUsage || !strings.Contains(errs, "invalid key") {
		t.Fatalf("get long key: exit %d %q", code, errs)
	}
	if code, _, _ := pglease(t, ctx, dsn, "list", "-o", "xml"); code != exitUsage {
		t.Fatalf("list -o xml: exit %d", code)
	}
	if code, _, _ := pglease(t, ctx, dsn, "frobnicate"); code != exitUsage {
		t.Fatalf("unknown command: exit %d", code)
	}
}

func TestForceReleaseGrantedAndRefused(t *testing.T) {
	ctx := testCtx(t)
	dsn := freshDB(t)
	mustRun(t, ctx, dsn, "install")
	srv := pgtest.Shared(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	operator, other := "pglease_operator_"+suffix, "pglease_other_"+suffix
	for _, r := range []string{operator, other} {
		if err := srv.CreateRole(ctx, r, "LOGIN NOSUPERUSER"); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "GRANT EXECUTE ON FUNCTION lease.force_release(text) TO "+operator); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dsn)
		if err == nil {
			c.Exec(context.Background(), "REVOKE ALL ON FUNCTION lease.force_release(text) FROM "+operator)
			c.Close(context.Background())
		}
	})
	c := lease.New(admin)
	if _, ok, err := c.Acquire(ctx, "job-42", "worker-a1", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	// Without --force: refused, nothing changed.
	if code, _, errs := pglease(t, ctx, pgtest.WithUser(dsn, operator), "release", "job-42"); code != exitUsage || !strings.Contains(errs, "--force") {
		t.Fatalf("release without --force: exit %d %q", code, errs)
	}
	// A role without the grant: permission denied, its own exit code, nothing changed.
	code, _, errs := pglease(t, ctx, pgtest.WithUser(dsn, other), "release", "--force", "job-42")
	if code != exitDenied || !strings.Contains(errs, "permission denied") || !strings.Contains(errs, "GRANT EXECUTE") {
		t.Fatalf("release --force as %s: exit %d %q", other, code, errs)
	}
	if s, err := c.Inspect(ctx, "job-42"); err != nil || !s.Held || s.Epoch != 1 {
		t.Fatalf("after refused release: %+v %v", s, err)
	}
	// The granted role frees it and fences the holder.
	out := mustRun(t, ctx, pgtest.WithUser(dsn, operator), "release", "--force", "job-42")
	if !strings.Contains(out, "released (was held by worker-a1)") || !strings.Contains(out, "epoch counter now 2") {
		t.Fatalf("release --force output %q", out)
	}
	if _, err := c.Renew(ctx, lease.Token{Key: "job-42", Owner: "worker-a1", Epoch: 1}, time.Minute); err == nil {
		t.Fatal("the fenced holder could still renew")
	}
	out = mustRun(t, ctx, pgtest.WithUser(dsn, operator), "release", "job-42", "--force")
	if !strings.Contains(out, "not held") {
		t.Fatalf("second release --force: %q", out)
	}
}

func TestWatchShowsALeaseMovingBetweenHolders(t *testing.T) {
	ctx := testCtx(t)
	dsn := freshDB(t)
	mustRun(t, ctx, dsn, "install")
	c := connect(t, ctx, dsn)
	if _, ok, err := c.Acquire(ctx, "job-42", "worker-a1", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}

	wctx, stop := context.WithCancel(ctx)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(wctx, []string{"--dsn", dsn, "watch", "job-42"}, &out, &errb, func(string) string { return "" })
	}()
	waitFor := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(out.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("watch output never showed %q:\n%s\nstderr: %s", what, out.String(), errb.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("held           job-42  holder=worker-a1 epoch=1")

	// a1 releases, b2 acquires with a short TTL and lets it lapse, a1 takes over.
	if err := c.Release(ctx, lease.Token{Key: "job-42", Owner: "worker-a1", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor("released       job-42  holder=worker-a1 epoch=1")
	if _, ok, err := c.Acquire(ctx, "job-42", "worker-b2", 500*time.Millisecond); err != nil || !ok {
		t.Fatalf("acquire b2: %v %v", ok, err)
	}
	waitFor("acquired       job-42  holder=worker-b2 epoch=3")
	waitFor("lapsed         job-42  holder=worker-b2 epoch=3")
	if _, ok, err := c.Acquire(ctx, "job-42", "worker-a1", time.Minute); err != nil || !ok {
		t.Fatalf("takeover by a1: %v %v", ok, err)
	}
	waitFor("takeover       job-42  holder=worker-a1 epoch=4")
	// Another key is not shown.
	if _, ok, err := c.Acquire(ctx, "job-43", "worker-a1", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	time.Sleep(200 * time.Millisecond)
	stop()
	if code := <-done; code != exitOK {
		t.Fatalf("watch exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "job-43") {
		t.Fatalf("watch job-42 showed job-43:\n%s", out.String())
	}
}

func TestPasswordNeverPrinted(t *testing.T) {
	ctx := testCtx(t)
	const secret = "s3cr3t-Pa55w0rd"
	srv := pgtest.Shared(t)
	// A database that does not exist: the connection error must not leak the password.
	dsn := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/no_such_db_%d?sslmode=disable", secret, srvPort(t, srv), time.Now().UnixNano())
	code, out, errs := pglease(t, ctx, dsn, "-v", "list")
	if code == exitOK {
		t.Fatalf("list against a missing database succeeded: %s", out)
	}
	if strings.Contains(out+errs, secret) {
		t.Fatalf("password printed:\nstdout: %s\nstderr: %s", out, errs)
	}
	if !strings.Contains(errs, "connecting to host=127.0.0.1") {
		t.Fatalf("-v did not say where it connects: %q", errs)
	}
	// A malformed connection string with a password: usage error, no password.
	code, out, errs = pglease(t, ctx, "postgres://u:"+secret+"@host:notaport/db", "list")
	if code != exitUsage || strings.Contains(out+errs, secret) {
		t.Fatalf("malformed dsn: exit %d, output %q %q", code, out, errs)
	}
}

func srvPort(t *testing.T, s *pgtest.Server) uint16 {
	t.Helper()
	cfg, err := pgx.ParseConfig(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Port
}
