package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"sigs.k8s.io/yaml"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

var commands = []string{"install", "version", "get", "list", "watch", "lock", "release", "cleanup", "history", "health", "serve-metrics", "candidates", "shards"}

// Guards: `pglease --help` exiting 2, `pglease get --help` calling --help
// an unknown flag, and a missing --version.
func TestHelpOnEveryCommandExitsZero(t *testing.T) {
	ctx := testCtx(t)
	none := env{}
	out, _ := wantExit(t, ctx, none, exitOK, "--help")
	for _, c := range commands {
		if !strings.Contains(out, c) {
			t.Errorf("pglease --help does not list %s:\n%s", c, out)
		}
	}
	if !strings.Contains(out, "Exit codes") {
		t.Errorf("pglease --help has no exit-code table:\n%s", out)
	}
	for _, c := range commands {
		for _, args := range [][]string{{c, "--help"}, {c, "-h"}, {"help", c}} {
			out, _ := wantExit(t, ctx, none, exitOK, args...)
			if !strings.Contains(out, "Usage:") || !strings.Contains(out, "pglease "+c) {
				t.Errorf("pglease %q: no usage of %s:\n%s", args, c, out)
			}
		}
	}
	out, _ = wantExit(t, ctx, none, exitOK, "--version")
	if !strings.Contains(out, "pglease ") || !strings.Contains(out, "pg_lease SQL "+leaseadmin.Version) {
		t.Errorf("--version: %q, want the module version and SQL %s", out, leaseadmin.Version)
	}
	out, _ = wantExit(t, ctx, none, exitOK, "version", "--client")
	if !strings.Contains(out, "ships:   pg_lease SQL "+leaseadmin.Version) {
		t.Errorf("version --client: %q", out)
	}
}

// Wrong flags, arguments and values are usage errors (exit 2), with no
// connection made (no DSN at all here: a connection attempt would fail with 1).
func TestUsageErrorsExitTwoWithoutConnecting(t *testing.T) {
	ctx := testCtx(t)
	bad := env{"PGLEASE_DSN": "host=127.0.0.1 port=1 connect_timeout=1"}
	for _, args := range [][]string{
		{"frobnicate"},
		{"get"},
		{"get", "k", "--bogus"},
		{"get", "k", "-o", "xml"},
		{"get", ""},
		{"get", strings.Repeat("k", 1025)},
		{"list", "extra"},
		{"list", "-o"},
		{"watch", "-o", "wide"},
		{"watch", "k", "--poll", "-1s"},
		{"release", "k"},
		{"release", "--force"},
		{"install", "extra"},
		{"cleanup"},
		{"cleanup", "--free-for", "1h", "--max-rows", "0"},
		{"cleanup", "--free-for", "soon"},
		{"lock", "k"},
		{"lock", "--", "true"},
		{"lock", "k", "--ttl", "10s", "--grace", "7s", "--", "true"},
		{"lock", "k", "--ttl", "100ms", "--", "true"},
		{"--dsn-file", "/nonexistent/pglease-dsn", "list"},
		{"history"},
		{"history", "k", "--limit", "0"},
		{"history", "k", "-o", "name"},
		{"health", "--period", "0s"},
		{"health", "-o", "name"},
		{"serve-metrics", "extra"},
		{"serve-metrics", "--period", "0s"},
		{"serve-metrics", "--timeout", "-1s"},
		{"serve-metrics", "--max-keys", "0"},
		{"serve-metrics", "--max-keys", "100001"},
		{"serve-metrics", "--max-keys", "many"},
		{"serve-metrics", "--key-prefix", ""},
		{"serve-metrics", "--listen", "9188"},
		{"serve-metrics", "--listen", "localhost:"},
		{"serve-metrics", "--listen", "localhost:65536"},
		{"serve-metrics", "--show-owners=maybe"},
		{"serve-metrics", "--bearer-token-file", "/nonexistent/pglease-token"},
	} {
		_, errs := wantExit(t, ctx, bad, exitUsage, args...)
		if strings.Contains(errs, "cannot connect") {
			t.Errorf("pglease %q connected before rejecting its arguments: %s", args, errs)
		}
	}
}

// Guards: `get k --dsn …` calling --dsn an unknown flag, and watch taking
// -o json and --help as key names.
func TestFlagsAnywhere(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)

	var one row
	out := mustRun(t, ctx, env{}, "get", "job-42", "--dsn", dsn, "-o", "json")
	if err := json.Unmarshal([]byte(out), &one); err != nil || one.Holder != "worker-a1" {
		t.Fatalf("get KEY --dsn DSN -o json: %q (%v)", out, err)
	}
	out = mustRun(t, ctx, env{}, "-o", "name", "list", "--dsn="+dsn)
	if out != "job-42\n" {
		t.Fatalf("-o name list --dsn=DSN: %q", out)
	}

	// watch -o json KEY: JSON lines about KEY, never a key named "-o".
	p := start(t, ctx, dsnEnv(dsn), "watch", "-o", "json", "job-42")
	p.waitFor(t, `"key":"job-42"`, false)
	p.stopOK(t, "watch")
	for _, l := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
		var e event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Key != "job-42" {
			t.Fatalf("watch -o json line %q: %+v %v", l, e, err)
		}
	}
}

// -o wide works; REMAINING is rounded (never 71h59m58.225s); AGE is shown.
func TestGetListFormats(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	g := acquire(t, ctx, c, "job-42", "worker-a1", 50*time.Minute) // below 0.3.0's default max_ttl (1 hour)
	acquire(t, ctx, c, "job-43", "worker-b2", time.Minute)
	if err := c.Release(ctx, lease.Token{Key: "job-43", Owner: "worker-b2", Epoch: 1}); err != nil {
		t.Fatal(err)
	}

	rows := tableRows(mustRun(t, ctx, e, "get", "job-42"))
	if len(rows) != 2 || strings.Join(rows[0], " ") != "KEY HOLDER STATUS EPOCH REMAINING AGE" {
		t.Fatalf("get table: %q", rows)
	}
	if r := rows[1]; len(r) != 6 || r[0] != "job-42" || r[1] != "worker-a1" || r[2] != "held" || r[3] != "1" || r[4] != "49m" || !regexp.MustCompile(`^\d+s$`).MatchString(r[5]) {
		t.Fatalf("get row %q: want job-42 worker-a1 held 1 49m <seconds>", r)
	}

	rows = tableRows(mustRun(t, ctx, e, "list", "-o", "wide"))
	if strings.Join(rows[0], " ") != "KEY HOLDER STATUS EPOCH REMAINING AGE SINCE EXPIRES" || len(rows) != 3 {
		t.Fatalf("list -o wide: %q", rows)
	}
	if r := rows[1]; r[7] != g.ExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z") {
		t.Fatalf("wide EXPIRES %q, grant expires %v", r[7], g.ExpiresAt)
	}
	if r := rows[2]; r[0] != "job-43" || r[1] != "<none>" || r[2] != "released" || r[3] != "2" || r[4] != "-" || r[7] != "-" {
		t.Fatalf("list -o wide released row: %q", r)
	}
	rows = tableRows(mustRun(t, ctx, e, "list", "--no-headers"))
	if len(rows) != 2 || rows[0][0] != "job-42" {
		t.Fatalf("list --no-headers: %q", rows)
	}
	if out := mustRun(t, ctx, e, "list", "-o", "name"); out != "job-42\njob-43\n" {
		t.Fatalf("list -o name: %q", out)
	}

	var one row
	if err := json.Unmarshal([]byte(mustRun(t, ctx, e, "get", "job-42", "-o", "json")), &one); err != nil {
		t.Fatal(err)
	}
	if one.Status != "held" || !one.Held || one.Holder != "worker-a1" || one.Epoch != g.Epoch || one.ExpiresAt == nil || !one.ExpiresAt.Equal(g.ExpiresAt) || one.AcquiredAt == nil {
		t.Fatalf("get -o json: %+v, grant %+v", one, g)
	}
	var all []row
	if err := yaml.Unmarshal([]byte(mustRun(t, ctx, e, "list", "-o", "yaml")), &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[1].Key != "job-43" || all[1].Status != "released" || all[1].Held || all[1].Epoch != 2 || all[1].Holder != "" {
		t.Fatalf("list -o yaml: %+v", all)
	}
	// Several keys: a list; one never leased: the others printed, exit 5.
	out, errs := wantExit(t, ctx, e, exitNotFound, "get", "job-42", "nope", "-o", "json")
	if err := json.Unmarshal([]byte(out), &all); err != nil || len(all) != 1 || !strings.Contains(errs, "never leased") {
		t.Fatalf("get job-42 nope: %q %q %v", out, errs, err)
	}
}

// A lapsed key keeps its holder (never `lapsed <none> 1 - -`).
func TestLapsedKeyKeepsItsHolder(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	acquire(t, ctx, c, "job-42", "worker-a1", 200*time.Millisecond)
	pgtest.WaitLapsed(t, c, "job-42", time.Minute)

	rows := tableRows(mustRun(t, ctx, dsnEnv(dsn), "get", "job-42"))
	if r := rows[1]; r[1] != "worker-a1" || r[2] != "lapsed" || r[3] != "1" || r[4] != "-" || r[5] == "-" {
		t.Fatalf("lapsed row %q: want holder worker-a1, lapsed, epoch 1, no REMAINING, an AGE", r)
	}
	var one row
	if err := json.Unmarshal([]byte(mustRun(t, ctx, dsnEnv(dsn), "get", "job-42", "-o", "json")), &one); err != nil {
		t.Fatal(err)
	}
	if one.Status != "lapsed" || one.Held || one.Holder != "worker-a1" || one.Since == nil || one.ExpiresAt == nil {
		t.Fatalf("lapsed -o json: %+v", one)
	}

	// Any other role sees the same: the holder of a lapsed grant and the
	// status come from lease.list, which every role may call.
	viewer := role(t, ctx, "pglease_viewer")
	rows = tableRows(mustRun(t, ctx, dsnEnv(pgtest.WithUser(dsn, viewer)), "get", "job-42"))
	if r := rows[1]; r[1] != "worker-a1" || r[2] != "lapsed" || r[3] != "1" || r[5] == "-" {
		t.Fatalf("lapsed row for another role: %q", r)
	}
}

// A key with a tab must not break the table. Any key and owner prints on
// one line and one cell, and survives json exactly.
func TestAnyKeyPrintsSafely(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	keys := map[string]string{
		"tab\tkey":           `"tab\tkey"`,
		"new\nline":          `"new\nline"`,
		"\x1b[31mred\x1b[0m": `"\x1b[31mred\x1b[0m"`,
		"bidi\u202ekey":      `"bidi\u202ekey"`,
		`"quoted"`:           `"\"quoted\""`,
		"two words":          `"two words"`,
		"plain-ключ":         "plain-ключ",
	}
	// pg_lease 0.2.0 takes any text; a later version may refuse control
	// characters (22023): a refused key is then one pglease never prints,
	// and get of it is a usage error.
	owner, quotedOwner := "owner\twith tab", `"owner\twith tab"`
	if _, _, err := c.Acquire(ctx, "probe", owner, time.Minute); errors.Is(err, lease.ErrInvalidInput) {
		owner, quotedOwner = "owner with space", `"owner with space"`
		t.Logf("the server refuses owners with a tab: using %q", owner)
		acquire(t, ctx, c, "probe", owner, time.Minute)
	}
	for k := range keys {
		if _, _, err := c.Acquire(ctx, k, owner, time.Minute); errors.Is(err, lease.ErrInvalidInput) {
			t.Logf("the server refuses key %q: %v", k, err)
			wantExit(t, ctx, dsnEnv(dsn), exitUsage, "get", k)
			delete(keys, k)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	keys["probe"] = "probe"
	if len(keys) < 4 {
		t.Fatalf("the server took only %d of the keys", len(keys))
	}
	out := mustRun(t, ctx, dsnEnv(dsn), "list")
	if strings.ContainsAny(out, "\t\x1b\u202e") || strings.Count(out, "\n") != len(keys)+1 {
		t.Fatalf("list printed raw control characters or broke lines:\n%q", out)
	}
	for _, r := range tableRows(out)[1:] {
		if len(r) != 6 || r[1] != quotedOwner {
			t.Fatalf("row %q: want 6 cells, the owner quoted", r)
		}
	}
	for k, quoted := range keys {
		if !strings.Contains(out, quoted+"   ") {
			t.Errorf("key %q not printed as %s:\n%s", k, quoted, out)
		}
		var one row
		if err := json.Unmarshal([]byte(mustRun(t, ctx, dsnEnv(dsn), "get", k, "-o", "json")), &one); err != nil || one.Key != k {
			t.Errorf("get %q -o json: %+v %v", k, one, err)
		}
	}
}

// `release --force` of a never-leased key exits 5, as get does.
func TestReleaseForce(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)

	wantExit(t, ctx, e, exitNotFound, "get", "never")
	_, errs := wantExit(t, ctx, e, exitNotFound, "release", "--force", "never")
	if !strings.Contains(errs, "never leased") {
		t.Fatalf("release --force never: %q", errs)
	}
	out := mustRun(t, ctx, e, "release", "job-42", "--force")
	if !strings.Contains(out, "released (was held by worker-a1)") || !strings.Contains(out, "epoch counter now 2") {
		t.Fatalf("release --force: %q", out)
	}
	if _, err := c.Renew(ctx, lease.Token{Key: "job-42", Owner: "worker-a1", Epoch: 1}, time.Minute); err == nil {
		t.Fatal("the fenced holder could still renew")
	}
	if out := mustRun(t, ctx, e, "release", "--force", "job-42"); !strings.Contains(out, "not held") {
		t.Fatalf("second release --force: %q", out)
	}
}

// A 42501 hints at the privilege of the call that failed, not always at
// GRANT EXECUTE ON FUNCTION lease.force_release (install's included).
func TestPermissionHintPerOperation(t *testing.T) {
	ctx := testCtx(t)
	dsn := leaseDB(t)
	app := role(t, ctx, "pglease_app")
	ae := dsnEnv(pgtest.WithUser(dsn, app))
	_, c := connect(t, ctx, dsn)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)

	_, errs := wantExit(t, ctx, ae, exitDenied, "release", "--force", "job-42")
	if !strings.Contains(errs, "permission denied") || !strings.Contains(errs, "GRANT EXECUTE ON FUNCTION lease.force_release(text) TO "+app) {
		t.Errorf("release --force without the grant: %q", errs)
	}
	_, errs = wantExit(t, ctx, ae, exitDenied, "cleanup", "--free-for", "1h")
	if !strings.Contains(errs, "GRANT EXECUTE ON FUNCTION lease.cleanup(interval, integer) TO "+app) || strings.Contains(errs, "force_release") {
		t.Errorf("cleanup without the grant: %q", errs)
	}
	// install in a database where the role may not create: the install hint.
	// (PUBLIC has no CREATE on a database.)
	fresh := freshDB(t)
	_, errs = wantExit(t, ctx, dsnEnv(pgtest.WithUser(fresh, app)), exitDenied, "install", "--schema-only")
	if !strings.Contains(errs, "CREATE ON DATABASE") || strings.Contains(errs, "force_release") {
		t.Errorf("install without CREATE: %q", errs)
	}
	// The role still reads: get works, the key shown held.
	if rows := tableRows(mustRun(t, ctx, ae, "get", "job-42")); rows[1][2] != "held" {
		t.Errorf("get as app: %q", rows)
	}
}

func TestNotInstalledAndVersionSkew(t *testing.T) {
	ctx := testCtx(t)
	dsn := freshDB(t)
	e := dsnEnv(dsn)
	for _, args := range [][]string{{"list"}, {"get", "k"}, {"release", "--force", "k"}, {"cleanup", "--free-for", "1h"}, {"lock", "k", "--", "true"}} {
		_, errs := wantExit(t, ctx, e, exitNotInstalled, args...)
		if !strings.Contains(errs, "not installed") || !strings.Contains(errs, "hint: run `pglease install`") {
			t.Errorf("%q before install: %q", args, errs)
		}
	}
	out := mustRun(t, ctx, e, "version")
	if !strings.Contains(out, "sql:     not installed") {
		t.Fatalf("version before install: %q", out)
	}
	conn, _ := connect(t, ctx, dsn)
	if _, err := conn.Exec(ctx, "CREATE EXTENSION pg_lease VERSION '0.1.0'"); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, ctx, e, "version"); !strings.Contains(out, "0.1.0 (extension)  (differs from the "+leaseadmin.Version) {
		t.Fatalf("version with 0.1.0 installed: %q", out)
	}
	_, errs := wantExit(t, ctx, e, exitIncompatible, "cleanup", "--free-for", "1h")
	if !strings.Contains(errs, "0.1.0 has no lease.cleanup") || !strings.Contains(errs, "hint: update it with `pglease install`") {
		t.Fatalf("cleanup on 0.1.0: %q", errs)
	}
	if out := mustRun(t, ctx, e, "install"); !strings.Contains(out, "pg_lease "+leaseadmin.Version+" installed (extension)") {
		t.Fatalf("install over 0.1.0: %q", out)
	}
	mustRun(t, ctx, e, "cleanup", "--free-for", "1h")

	// A newer version than this pglease ships is refused: exit 6.
	newer := dsnEnv(freshDB(t))
	nconn, _ := connect(t, ctx, newer["PGLEASE_DSN"])
	if _, err := nconn.Exec(ctx, `CREATE SCHEMA lease; CREATE FUNCTION lease.version() RETURNS text LANGUAGE sql AS $$ SELECT '9.9.9'::text $$`); err != nil {
		t.Fatal(err)
	}
	_, errs = wantExit(t, ctx, newer, exitIncompatible, "install", "--schema-only")
	if !strings.Contains(errs, "9.9.9") || !strings.Contains(errs, "hint: this pglease ships pg_lease "+leaseadmin.Version) {
		t.Errorf("install over a newer version: %q", errs)
	}
}

// The argument parsing is reachable without a server (the fuzz target's
// entry point): connectFn is the only way out.
func TestArgumentParsingReachesNoServer(t *testing.T) {
	errNoServer := errors.New("no server in this test")
	for _, args := range [][]string{{}, {"get", "k", "-o", "wide"}, {"list", "--no-headers"}, {"watch", "-o", "json", "a", "b"}, {"lock", "k", "--", "true"}, {"cleanup", "--free-for", "1h"}, {"get", "--bogus"}} {
		var out, errb syncBuffer
		root, a := newRootCmd(&out, &errb, func(string) string { return "" })
		dialed := false
		a.connectFn = func(context.Context, *pgx.ConnConfig) (*pgx.Conn, error) { dialed = true; return nil, errNoServer }
		root.SetArgs(args)
		cmd, err := root.ExecuteContextC(t.Context())
		code := a.exit(cmd, err)
		switch {
		case len(args) == 0 && (code != exitOK || !strings.Contains(out.String(), "Usage:")):
			t.Errorf("pglease without arguments: exit %d, %q: want the help, exit 0", code, out.String())
		case len(args) > 0 && args[len(args)-1] == "--bogus" && (code != exitUsage || dialed):
			t.Errorf("%q: exit %d, dialed %v", args, code, dialed)
		case len(args) > 0 && args[len(args)-1] != "--bogus" && (code != exitError || !dialed || !errors.Is(err, errNoServer)):
			t.Errorf("%q: exit %d, dialed %v, err %v: want the connection refused through connectFn", args, code, dialed, err)
		}
	}
}

func TestInstallBothModes(t *testing.T) {
	for _, mode := range []struct {
		args []string
		want string
	}{{[]string{"install"}, "(extension)"}, {[]string{"install", "--schema-only"}, "(schema)"}} {
		t.Run(strings.Join(mode.args, " "), func(t *testing.T) {
			ctx := testCtx(t)
			e := dsnEnv(freshDB(t))
			out := mustRun(t, ctx, e, mode.args...)
			if !strings.Contains(out, "pg_lease "+leaseadmin.Version+" installed "+mode.want) {
				t.Fatalf("install output %q", out)
			}
			mustRun(t, ctx, e, mode.args...) // idempotent
			out = mustRun(t, ctx, e, "version")
			if !strings.Contains(out, "sql:     "+leaseadmin.Version+" "+mode.want) || !strings.Contains(out, "server:  PostgreSQL ") {
				t.Fatalf("version output %q", out)
			}
		})
	}
}

func TestCleanup(t *testing.T) {
	ctx, dsn, c := leaseSetup(t)
	e := dsnEnv(dsn)
	for i := range 3 {
		k := fmt.Sprintf("job-%d", i)
		acquire(t, ctx, c, k, "w", time.Minute)
		if err := c.Release(ctx, lease.Token{Key: k, Owner: "w", Epoch: 1}); err != nil {
			t.Fatal(err)
		}
	}
	acquire(t, ctx, c, "held", "w", time.Minute)
	out := mustRun(t, ctx, e, "cleanup", "--free-for", "0s", "--max-rows", "2")
	if !strings.Contains(out, "removed 2 key(s)") || !strings.Contains(out, "epoch floor 2") {
		t.Fatalf("cleanup: %q", out)
	}
	if out := mustRun(t, ctx, e, "cleanup", "--free-for", "0s"); !strings.Contains(out, "removed 1 key(s)") {
		t.Fatalf("second cleanup: %q", out)
	}
	if out := mustRun(t, ctx, e, "list", "-o", "name"); out != "held\n" {
		t.Fatalf("after cleanup: %q", out)
	}
}

// A connection error names its real cause, not `tls error: server refused
// TLS connection`, and a refused connection says it once.
func TestConnectionErrorsAreOneLine(t *testing.T) {
	ctx := testCtx(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	srv := pgtest.Shared(t)
	for _, tc := range []struct {
		dsn, want string
	}{
		{fmt.Sprintf("postgres://u@127.0.0.1:%d/db?connect_timeout=5", port), "connection refused"},
		{fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=no_such_db_%d", srv.Port(), time.Now().UnixNano()), "does not exist (SQLSTATE 3D000)"},
	} {
		_, errs := wantExit(t, ctx, dsnEnv(tc.dsn), exitError, "list")
		if strings.Count(errs, "\n") != 1 || strings.Contains(errs, "tls error") || strings.Count(errs, tc.want) != 1 || !strings.HasPrefix(errs, "pglease: cannot connect: ") {
			t.Errorf("connection error for %s: %q: want one line, no tls error, %q once", tc.dsn, errs, tc.want)
		}
	}
}

// Messages quote server text (a DETAIL naming a key); they stay one line.
func TestSafeLine(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ключ":        "plain text, ключ",
		"key \"a\tb\"\nnext":      `key "a\tb"\nnext`,
		"esc \x1b[2J bidi \u202e": `esc \x1b[2J bidi \u202e`,
	} {
		if got := safeLine(in); got != want {
			t.Errorf("safeLine(%q) = %q, want %q", in, got, want)
		}
	}
}
