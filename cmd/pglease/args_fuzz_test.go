package main

// FuzzArgs: the command line, fuzzed, through the in-process entry point
// against a real database. Kept small so that it follows the entry point
// when the CLI is restructured: only runArgs() below calls into the CLI.

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pg_lease/internal/pgtest"
	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// fuzzPassword is in the DSN (the throwaway server trusts every login) and
// must never be printed.
const fuzzPassword = "fuzz-s3cret-pw"

// FuzzArgs runs pglease with the arguments in argv (separated by NUL bytes,
// which no argv can hold) after --dsn. Every argument list must end in a
// defined exit code (0-5) without a panic; a usage error (2) prints nothing
// on stdout; an argument the server would refuse as invalid input (22023)
// exits 2, not 1; a failing command changes no lease; the password is
// never printed.
func FuzzArgs(f *testing.F) {
	for _, s := range []string{
		"", "version", "list", "list\x00-o\x00json", "list\x00-o=yaml", "list\x00-o", "list\x00-o\x00xml", "list\x00k",
		"get\x00k", "get\x00k\x00-o\x00json", "get", "get\x00a\x00b", "get\x00", "get\x00" + strings.Repeat("k", 1025),
		"get\x00-o", "get\x00--output=table\x00k", "get\x00\xff", "get\x00k\n",
		"release\x00k", "release\x00--force\x00k", "release\x00k\x00--force", "release\x00--force", "release\x00-x\x00k",
		"release\x00--force\x00held", "release\x00--force\x00free",
		"install", "install\x00--schema-only", "install\x00extra", "-v\x00list", "-h", "--help", "nope",
		"watch\x00k", "watch\x00", "-v", "-v\x00-v\x00version",
	} {
		f.Add(s)
	}
	base := pgtest.NewLeaseDatabase(f)
	u, err := url.Parse(base)
	if err != nil {
		f.Fatal(err)
	}
	u.User = url.UserPassword(pgtest.Superuser, fuzzPassword)
	dsn := u.String()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close(context.Background()) })
	c := lease.New(conn)

	f.Fuzz(func(t *testing.T, argv string) {
		args := strings.Split(argv, "\x00")
		if argv == "" {
			args = nil
		}
		for _, a := range args {
			if strings.Contains(strings.ToLower(a), "dsn") {
				return // another server: not this target's business
			}
		}
		// keys "held" and "free" in their states, through the functions
		// (other keys as earlier inputs left them)
		for _, k := range []string{"held", "free"} {
			if _, _, _, err := leaseadmin.ForceRelease(ctx, c, k); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok, err := c.Acquire(ctx, "held", "someone", time.Hour); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if g, ok, err := c.Acquire(ctx, "free", "someone", time.Hour); err != nil || !ok {
			t.Fatal(ok, err)
		} else if err := c.Release(ctx, g.Token); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, conn)

		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		watch := false
		for _, a := range args {
			if a == "watch" {
				watch = true
			}
		}
		if watch {
			cancel() // watch runs until interrupted: interrupt it at once
		}
		code, stdout, stderr := runArgs(rctx, dsn, args)

		if code < exitOK || code > exitNotFound {
			t.Fatalf("pglease %q: exit %d", args, code)
		}
		if strings.Contains(stdout+stderr, fuzzPassword) {
			t.Fatalf("pglease %q printed the password:\n%s\n%s", args, stdout, stderr)
		}
		if code == exitUsage && stdout != "" {
			t.Fatalf("pglease %q: usage error with output %q", args, stdout)
		}
		if code == exitError && (strings.Contains(stderr, "SQLSTATE 22023") || strings.Contains(stderr, "invalid input")) {
			t.Fatalf("pglease %q: invalid input exits %d, want %d:\n%s", args, code, exitUsage, stderr)
		}
		if code != exitOK {
			if after := snapshot(t, conn); after != before {
				t.Fatalf("pglease %q failed (exit %d) but changed the leases:\n%s\n->\n%s\n%s", args, code, before, after, stderr)
			}
		}
	})
}

// runArgs is the one call into the CLI.
func runArgs(ctx context.Context, dsn string, args []string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(ctx, append([]string{"--dsn", dsn}, args...), &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

func snapshot(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(l::text, E'\n' ORDER BY l.key), '') FROM lease.list() l`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
