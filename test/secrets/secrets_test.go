// Package secrets checks that no command of the module prints a database
// password: every main package, found with go list, runs with a wrong flag,
// with --help, and with bad connection strings that carry a password in its
// environment, in its DSN flags and in the files its DSN-file flags name.
package secrets

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const secret = "s3cr3t-Pa55w0rd-7q"

// dsnVar matches the name of an environment variable that holds a
// connection string, a password or a file of one.
var dsnVar = regexp.MustCompile(`\b([A-Z][A-Z0-9_]*(?:DSN|PASSWORD)(?:_FILE)?)\b`)

// getenv matches a literal variable name read in Go source.
var getenv = regexp.MustCompile(`(?:Getenv|LookupEnv)\("([A-Z][A-Z0-9_]*)"\)`)

// flagName matches a flag in a usage text: Go's flag package ("  -dsn
// string") and cobra ("  -o, --output string", "      --dsn string").
var flagName = regexp.MustCompile(`(?m)^\s+(?:-[A-Za-z], )?--?([A-Za-z][A-Za-z0-9_.-]*)`)

type binary struct {
	pkg, dir, path string
	usage          string
	envVars        []string // DSN-like variables its usage names or its main package reads
	dsnFlags       []string // flags naming "dsn", not files
	fileFlags      []string // flags naming "dsn" and "file"
	envFlags       []string // flags naming "dsn" that name a variable ("-env")
}

// TestNoBinaryPrintsAPassword runs every command of the module. Each run has
// a password in every DSN-like variable the command's usage text or main
// package reads (and in PGPASSWORD and PGLEASE_DSN), and the password must
// appear on neither stdout nor stderr. The bad inputs: an unknown flag,
// --help, a malformed DSN, a refused address, and a database that does not
// exist on a live server, each through the environment, each DSN flag and
// each DSN-file flag (and each flag that names a DSN's variable).
func TestNoBinaryPrintsAPassword(t *testing.T) {
	ctx := pgtest.Context(t, 15*time.Minute)
	bins := buildAll(t, ctx)
	srv := pgtest.Shared(t)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	bad := map[string]string{
		"malformed": "postgres://lease:" + secret + "@host:notaport/db",
		"refused":   fmt.Sprintf("postgres://lease:%s@127.0.0.1:%d/db?connect_timeout=5", secret, refusedPort),
		"no-db": fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/no_such_db_%d?connect_timeout=5&sslmode=disable",
			secret, srv.Port(), time.Now().UnixNano()),
		"keyword": fmt.Sprintf("host=127.0.0.1 port=%d user=lease password=%s dbname=db connect_timeout=5", refusedPort, secret),
	}
	kinds := []string{"malformed", "refused", "no-db", "keyword"}
	files := map[string]string{}
	for _, k := range kinds {
		files[k] = filepath.Join(t.TempDir(), k)
		if err := os.WriteFile(files[k], []byte(bad[k]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	for _, b := range bins {
		t.Run(filepath.Base(b.pkg), func(t *testing.T) {
			envFor := func(kind string) []string {
				env := []string{"PGPASSWORD=" + secret, "PGLEASE_DSN=" + bad[kind]}
				for _, v := range b.envVars {
					if strings.HasSuffix(v, "_FILE") {
						env = append(env, v+"="+files[kind])
					} else if v != "PGPASSWORD" && v != "PGLEASE_DSN" {
						env = append(env, v+"="+bad[kind])
					}
				}
				return env
			}
			check := func(env []string, args ...string) (int, string) {
				t.Helper()
				code, out := run(t, ctx, b.path, env, args...)
				if strings.Contains(out, secret) {
					t.Errorf("%s %q with %v printed the password:\n%s", b.pkg, args, names(env), out)
				}
				return code, out
			}

			code, out := check(envFor("refused"), "-no-such-flag")
			if code == 0 || !strings.Contains(out, "no-such-flag") {
				t.Errorf("%s -no-such-flag: exit %d, want a usage error naming the flag:\n%s", b.pkg, code, out)
			}
			for _, kind := range kinds {
				check(envFor(kind), "--help")
				check(envFor(kind), "-h")
			}
			for _, f := range b.dsnFlags {
				for _, kind := range kinds {
					check(envFor(kind), "--"+f+"="+bad[kind])
					check(envFor(kind), "--"+f, bad[kind], "--no-such-flag")
				}
			}
			for _, f := range b.fileFlags {
				for _, kind := range kinds {
					check(envFor(kind), "--"+f+"="+files[kind])
				}
			}
			for _, f := range b.envFlags {
				for _, kind := range kinds {
					check(append(envFor(kind), "SECRETS_TEST_DSN="+bad[kind]), "--"+f+"=SECRETS_TEST_DSN")
				}
			}
			if len(b.envVars) > 0 {
				for _, kind := range kinds {
					check(envFor(kind))
				}
			}
		})
	}
}

// buildAll builds every main package of the module and reads each one's
// usage text.
func buildAll(t *testing.T, ctx context.Context) []binary {
	t.Helper()
	goBin := goCommand(t)
	root := strings.TrimSpace(output(t, ctx, goBin, "list", "-m", "-f", "{{.Dir}}"))
	list := output(t, ctx, goBin, "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}} {{.Dir}}{{end}}`, root+"/...")
	dir := t.TempDir()
	var bins []binary
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		bins = append(bins, binary{pkg: f[0], dir: f[1], path: filepath.Join(dir, filepath.Base(f[0]))})
		pkgs = append(pkgs, f[0])
	}
	// The module has commands, examples, benchmarks and test programs: a
	// listing that finds fewer went wrong.
	if len(bins) < 10 {
		t.Fatalf("go list found %d main packages, want every command of the module:\n%s", len(bins), list)
	}
	seen := map[string]bool{}
	for _, b := range bins {
		if seen[filepath.Base(b.path)] {
			t.Fatalf("two main packages named %s: give each binary its own directory", filepath.Base(b.path))
		}
		seen[filepath.Base(b.path)] = true
	}
	cmd := exec.CommandContext(ctx, goBin, append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for i := range bins {
		b := &bins[i]
		_, b.usage = run(t, ctx, b.path, nil, "-h")
		vars := map[string]bool{}
		for _, m := range dsnVar.FindAllStringSubmatch(b.usage, -1) {
			vars[m[1]] = true
		}
		srcs, _ := filepath.Glob(filepath.Join(b.dir, "*.go"))
		for _, s := range srcs {
			if strings.HasSuffix(s, "_test.go") {
				continue
			}
			src, err := os.ReadFile(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range getenv.FindAllStringSubmatch(string(src), -1) {
				if dsnVar.MatchString(m[1]) {
					vars[m[1]] = true
				}
			}
		}
		for v := range vars {
			b.envVars = append(b.envVars, v)
		}
		sort.Strings(b.envVars)
		for _, m := range flagName.FindAllStringSubmatch(b.usage, -1) {
			name := m[1]
			if !strings.Contains(strings.ToLower(name), "dsn") {
				continue
			}
			if strings.HasSuffix(name, "-env") {
				b.envFlags = append(b.envFlags, name)
			} else if strings.Contains(name, "file") {
				b.fileFlags = append(b.fileFlags, name)
			} else if !slices.Contains(b.dsnFlags, name) {
				b.dsnFlags = append(b.dsnFlags, name)
			}
		}
		t.Logf("%s: DSN flags %v, DSN-file flags %v, DSN-variable flags %v, environment %v",
			b.pkg, b.dsnFlags, b.fileFlags, b.envFlags, b.envVars)
	}
	return bins
}

// run runs bin in a process group of its own with only env (and PATH,
// HOME), and returns its exit code and stdout+stderr. A run that outlives
// runTimeout is killed with its children and fails the test.
func run(t *testing.T, ctx context.Context, bin string, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	cmd.Dir = t.TempDir()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Errorf("%s %q with %v: still running after %v (killed):\n%s", filepath.Base(bin), args, names(env), runTimeout, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// runTimeout bounds one run: every bad input fails fast (a refused port, a
// missing database), so only a command that ignores its arguments gets near it.
const runTimeout = 90 * time.Second

func names(env []string) []string {
	var ns []string
	for _, e := range env {
		ns = append(ns, strings.SplitN(e, "=", 2)[0])
	}
	return ns
}

func goCommand(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"go", filepath.Join(os.Getenv("GOROOT"), "bin", "go"), "/usr/local/go/bin/go"} {
		if b, err := exec.LookPath(p); err == nil {
			return b
		}
	}
	t.Fatal("this test builds every command of the module and needs the go command (not on PATH, not in $GOROOT/bin or /usr/local/go/bin)")
	return ""
}

func output(t *testing.T, ctx context.Context, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %q: %v\n%s", name, args, err, stderr)
	}
	return string(out)
}
