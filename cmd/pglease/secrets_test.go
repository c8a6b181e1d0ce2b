package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// No secret in any output. The built binary runs with a
// password-bearing DSN in its environment (the throwaway server trusts
// loopback, so the password is sent and ignored) through help, bad flags,
// connection errors, every command and every output format, with -v; the
// password never appears on stdout or stderr.
func TestPasswordNeverPrinted(t *testing.T) {
	ctx := testCtx(t)
	const secret = "s3cr3t-Pa55w0rd"
	dsn := leaseDB(t)
	srv := pgtest.Shared(t)
	_, c := connect(t, ctx, dsn)
	acquire(t, ctx, c, "job-42", "worker-a1", time.Minute)
	acquire(t, ctx, c, "job-43", "worker-b2", time.Minute)

	withPassword := func(d string) string {
		if strings.Contains(d, "://") {
			return strings.Replace(d, "://postgres@", "://postgres:"+secret+"@", 1)
		}
		return d + " password=" + secret
	}
	good := withPassword(dsn)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/db?connect_timeout=5", secret, l.Addr().(*net.TCPAddr).Port)
	l.Close()
	noDB := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/no_such_db_%d?sslmode=prefer", secret, srv.Port(), time.Now().UnixNano())
	malformed := "postgres://u:" + secret + "@host:notaport/db"
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(good+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	type invocation struct {
		e    env
		args []string
		code int
	}
	var runs []invocation
	for _, e := range []env{{"PGLEASE_DSN": good}, {"PGLEASE_DSN_FILE": dsnFile}, {"PGPASSWORD": secret, "PGLEASE_DSN": dsn}} {
		runs = append(runs,
			invocation{e, []string{"--help"}, exitOK},
			invocation{e, []string{"get", "--help"}, exitOK},
			invocation{e, []string{"--no-such-flag"}, exitUsage},
			invocation{e, []string{"get", "job-42", "--no-such-flag"}, exitUsage},
			invocation{e, []string{"-v", "version"}, exitOK},
			invocation{e, []string{"-v", "install"}, exitOK},
			invocation{e, []string{"get", "never-leased"}, exitNotFound},
			invocation{e, []string{"-v", "lock", "job-44", "--", "true"}, exitOK},
			invocation{e, []string{"-v", "cleanup", "--free-for", "1h"}, exitOK},
			invocation{e, []string{"release", "--force", "job-43"}, exitOK},
		)
		for _, f := range getFormats {
			runs = append(runs,
				invocation{e, []string{"-v", "get", "job-42", "-o", f}, exitOK},
				invocation{e, []string{"list", "-o", f, "-v"}, exitOK})
		}
	}
	runs = append(runs,
		invocation{env{"PGLEASE_DSN": refused}, []string{"-v", "list"}, exitError},
		invocation{env{"PGLEASE_DSN": noDB}, []string{"-v", "get", "k"}, exitError},
		invocation{env{"PGLEASE_DSN": malformed}, []string{"-v", "list"}, exitUsage},
		invocation{env{}, []string{"--dsn", refused, "list"}, exitError},
		invocation{env{}, []string{"list", "--dsn", malformed}, exitUsage},
	)
	for _, r := range runs {
		code, out, errs := runBinary(t, ctx, r.e, r.args...)
		if code != r.code {
			t.Errorf("pglease %q (env %v): exit %d, want %d\nstdout: %s\nstderr: %s", r.args, keysOf(r.e), code, r.code, out, errs)
		}
		if strings.Contains(out+errs, secret) {
			t.Errorf("pglease %q (env %v) printed the password:\nstdout: %s\nstderr: %s", r.args, keysOf(r.e), out, errs)
		}
	}

	// watch, every format, until interrupted.
	for _, f := range watchFormats {
		t.Setenv(envBinary, buildBinary(t))
		p := start(t, ctx, env{"PGLEASE_DSN": good}, "-v", "watch", "-o", f)
		p.waitFor(t, "job-42", false)
		p.stop()
		p.wait(t)
		if strings.Contains(p.out.String()+p.err.String(), secret) {
			t.Errorf("watch -o %s printed the password:\n%s\n%s", f, p.out.String(), p.err.String())
		}
	}
}

func keysOf(e env) []string {
	var ks []string
	for k := range e {
		ks = append(ks, k)
	}
	return ks
}
