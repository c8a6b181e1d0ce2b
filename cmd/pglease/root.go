package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

const exitCodesHelp = `Exit codes (every command):
  0    success
  1    error: connection, server, anything not below
  2    usage: bad flag, argument, key or duration (nothing sent to the server)
  3    pg_lease is not installed in the database (run pglease install)
  4    permission denied (SQLSTATE 42501; the hint names the GRANT)
  5    a named key was never leased (get, release --force)
  6    the installed pg_lease does not fit this pglease (version or install mode)
  7    lock: the lease was lost and the command was stopped
  8    lock: the key stayed held by another owner for the whole --timeout
  9    unknown outcome: the change committed on the primary, but its wait for
       the synchronous standbys was cancelled; a failover may lose it (lock:
       the grant was not used, it lapses; release --force: run it again)
  10   lock: no grant during the grace after a promotion, which outlasted
       --timeout (pglease status shows when it ends)
  11   schema lease is not a pg_lease install this role can trust: not
       pg_lease's, or another role's that cannot act as this one (install,
       version, cleanup, release --force); nothing in it was run
  126  lock: the command could not be run
  127  lock: the command was not found
  else lock: the command's own exit status (128+N when killed by signal N)`

// version is this build's version; release builds set it with
// -ldflags "-X main.version=v0.2.0". Empty: the module version from the
// build information ("(devel)" for a build inside the source tree).
var version string

func moduleVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func versionLine() string {
	return fmt.Sprintf("pglease %s (pg_lease SQL %s, %s %s/%s)", moduleVersion(), leaseadmin.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// errUsage marks errors that are the caller's: exit 2.
var errUsage = errors.New("usage")

// errNotFound: a named key was never leased: exit 5.
var errNotFound = errors.New("key was never leased")

// app is one invocation: its streams, global flags and connection settings.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string

	dsn, dsnFile string
	verbose      bool

	cfg       *pgx.ConnConfig // set by config()
	password  string          // redacted from everything printed
	token     string          // serve-metrics' bearer token, redacted too
	dsnSource string          // where the DSN came from, for messages

	// connectFn opens a connection; tests and fuzzers may replace it (a
	// fuzzer that only parses arguments returns an error from it).
	connectFn func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error)

	// inCommand is set when a command's RunE starts: cobra's own errors
	// (unknown command or flag, wrong number of arguments) come before it.
	inCommand bool
	// op names the operation that failed, for the hint (install,
	// force_release, cleanup, ...).
	op string
	// exitCode, when non-zero, is the exit status a command chose itself
	// (lock: the command's status).
	exitCode int
}

// newRootCmd builds the command tree writing to stdout and stderr and
// reading the environment through getenv. Execute it with SetArgs and
// ExecuteContext, then a.exit(err) gives the exit status (run does that).
// Argument parsing reaches the server only through a.connectFn.
func newRootCmd(stdout, stderr io.Writer, getenv func(string) string) (*cobra.Command, *app) {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv, connectFn: pgx.ConnectConfig}
	root := &cobra.Command{
		Use:   "pglease",
		Short: "Operate pg_lease leases",
		Long: `pglease shows and fixes pg_lease leases (keys held by an owner under a fencing
epoch, with server-clock expiry) and runs commands under a lease.

Connection: --dsn-file PATH, else $PGLEASE_DSN_FILE, else $PGLEASE_DSN, else the
libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD,
PGSSLMODE, PGPASSFILE, ...). --dsn also works but shows the password to every
local user in the process list. Passwords are never printed.

` + exitCodesHelp,
		Version:       versionLine(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a subcommand: help, exit 0 (as kubectl).
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w: %v", errUsage, err)
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.dsnFile, "dsn-file", "", "file holding the connection string (libpq keyword/value or URL)")
	pf.StringVar(&a.dsn, "dsn", "", "connection string; visible in the process list: prefer --dsn-file or $PGLEASE_DSN")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "say on stderr what is being done (never passwords)")
	root.Flags().BoolP("version", "", false, "print pglease's version and the pg_lease SQL version it ships")

	root.AddCommand(
		a.installCmd(),
		a.versionCmd(),
		a.getCmd(),
		a.listCmd(),
		a.watchCmd(),
		a.lockCmd(),
		a.releaseCmd(),
		a.cleanupCmd(),
		a.historyCmd(),
		a.healthCmd(),
		a.statusCmd(),
		a.serveMetricsCmd(),
		a.candidatesCmd(),
		a.shardsCmd(),
	)
	root.CompletionOptions.HiddenDefaultCmd = true
	return root, a
}

// run is main without the process: parses args, runs the command, returns
// the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	root, a := newRootCmd(stdout, stderr, getenv)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	return a.exit(cmd, err)
}

// runE wraps a command's body: marks that parsing is over and records the
// operation for the error's hint.
func (a *app) runE(op string, f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.inCommand = true
		a.op = op
		return f(cmd, args)
	}
}

// usagef is a usage error (exit 2).
func usagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

func (a *app) logf(format string, args ...any) {
	if a.verbose {
		fmt.Fprintln(a.stderr, a.redact("pglease: "+safeLine(fmt.Sprintf(format, args...))))
	}
}

// warnf prints a line on stderr, redacted.
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintln(a.stderr, a.redact("pglease: "+safeLine(fmt.Sprintf(format, args...))))
}

func (a *app) redact(s string) string {
	if a.password != "" {
		s = strings.ReplaceAll(s, a.password, "xxxxx")
	}
	if a.token != "" {
		s = strings.ReplaceAll(s, a.token, "xxxxx")
	}
	return s
}

func (a *app) user() string {
	if a.cfg == nil {
		return "this role"
	}
	return quoteIdent(a.cfg.User)
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// quoteIdent quotes a role or database name for SQL only where needed.
func quoteIdent(s string) string {
	if plainIdent.MatchString(s) {
		return s
	}
	return pgx.Identifier{s}.Sanitize()
}

func (a *app) database() string {
	if a.cfg == nil || a.cfg.Database == "" {
		return "the database"
	}
	return quoteIdent(a.cfg.Database)
}
