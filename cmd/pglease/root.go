package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"
)

// Exit codes, the same for every command. lock adds the command's own status
// once the command has started (see lockHelp).
const (
	exitOK           = 0
	exitError        = 1  // connection, server or other error
	exitUsage        = 2  // bad flag, argument, key or duration: nothing was sent to the server
	exitNotInstalled = 3  // pg_lease is not installed in the database
	exitDenied       = 4  // permission denied (SQLSTATE 42501)
	exitNotFound     = 5  // a named key was never leased (get, release --force)
	exitIncompatible = 6  // the installed pg_lease's version or mode does not fit this pglease
	exitLost         = 7  // lock: the lease was lost, the command was stopped
	exitHeld         = 8  // lock: the key stayed held by another owner for the whole --timeout
	exitUnknown      = 9  // a change's commit was not confirmed by the synchronous standbys (lease.ErrCommitUnknown)
	exitGrace        = 10 // lock: the grace after a promotion outlasted --timeout (lease.ErrGrace)
	exitUntrusted    = 11 // schema lease is not a pg_lease install this role can trust (leaseadmin.ErrSquatted)
	exitCannotExec   = 126
	exitNoCommand    = 127
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

// config parses the connection settings (no network).
func (a *app) config() (*pgx.ConnConfig, error) {
	if a.cfg != nil {
		return a.cfg, nil
	}
	dsn, source := a.dsn, "--dsn"
	switch {
	case dsn != "":
	case a.dsnFile != "" || a.getenv("PGLEASE_DSN_FILE") != "":
		path := a.dsnFile
		source = "--dsn-file " + path
		if path == "" {
			path = a.getenv("PGLEASE_DSN_FILE")
			source = "$PGLEASE_DSN_FILE (" + path + ")"
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, usagef("reading the connection string: %v", err)
		}
		dsn = strings.TrimSpace(string(b))
	case a.getenv("PGLEASE_DSN") != "":
		dsn, source = a.getenv("PGLEASE_DSN"), "$PGLEASE_DSN"
	default:
		source = "the PG* environment variables"
	}
	a.dsnSource = source
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("invalid connection string from %s: %s", source, parseErrorText(dsn, err))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	// A change whose wait for the synchronous standbys was cancelled is
	// reported as unknown, never as done (lease.ErrCommitUnknown).
	lease.ObserveCommits(&cfg.Config)
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "pglease"
	}
	a.cfg, a.password = cfg, cfg.Password
	return cfg, nil
}

// connect opens a connection with the invocation's settings.
func (a *app) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := a.config()
	if err != nil {
		return nil, err
	}
	a.logf("connecting to host=%s port=%d dbname=%s user=%s (from %s)", cfg.Host, cfg.Port, cfg.Database, cfg.User, a.dsnSource)
	conn, err := a.connectFn(ctx, cfg.Copy())
	if err != nil {
		return nil, &connectError{err: err}
	}
	if err := a.refuseUntrusted(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// refuseUntrusted: a superuser calls nothing in schema lease unless it can
// trust the install (leaseadmin.Describe): a function another role owns
// would run with the superuser's privileges. install and version read the
// install themselves and call nothing untrusted.
func (a *app) refuseUntrusted(ctx context.Context, conn *pgx.Conn) error {
	if a.op == "install" || a.op == "version" || conn.PgConn().ParameterStatus("is_superuser") != "on" {
		return nil
	}
	in, err := leaseadmin.Describe(ctx, conn)
	if errors.Is(err, lease.ErrNotInstalled) {
		return nil
	}
	if err != nil {
		return err
	}
	return in.TrustError()
}

// withConn runs f on a new connection, closed afterwards.
func (a *app) withConn(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
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

// exit prints err (one line, redacted, with a hint where one helps) and maps
// it to the exit status.
func (a *app) exit(cmd *cobra.Command, err error) int {
	if err == nil {
		return a.exitCode
	}
	if !a.inCommand && !errors.Is(err, errUsage) {
		err = fmt.Errorf("%w: %v", errUsage, err) // cobra's own: unknown command, arguments
	}
	code, msg, hint := a.classify(err)
	if code == exitOK {
		return a.exitCode
	}
	fmt.Fprintln(a.stderr, a.redact("pglease: "+safeLine(msg)))
	if hint != "" {
		fmt.Fprintln(a.stderr, a.redact("hint: "+safeLine(hint)))
	}
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// classify maps an error to its exit status, its one-line message and a
// hint for the operation that failed.
func (a *app) classify(err error) (code int, msg, hint string) {
	msg = strings.TrimPrefix(err.Error(), "usage: ")
	var ce *connectError
	var ie *incompatibleError
	var cd *codedError
	switch {
	case errors.As(err, &cd):
		return cd.code, cd.msg, cd.hint
	case errors.Is(err, context.Canceled):
		return exitOK, "", "" // interrupted (watch): a normal end
	case errors.As(err, &ce):
		return exitError, ce.Error(), ""
	case errors.Is(err, lease.ErrCommitUnknown):
		return exitUnknown, msg, "the change may be lost by a failover: do not act on it; check the synchronous standbys (synchronous_standby_names, pg_stat_replication)"
	case errors.Is(err, lease.ErrGrace):
		return exitGrace, msg, "no new grant before the grace after a promotion ends: `pglease status` shows when"
	case errors.Is(err, errUsage), errors.Is(err, lease.ErrInvalidInput):
		return exitUsage, msg, ""
	case errors.Is(err, leaseadmin.ErrSquatted):
		return exitUntrusted, msg, "if that role installed pg_lease, run this as that role; otherwise schema lease is not yours to use: have its owner or a superuser drop it (DROP SCHEMA lease CASCADE) and install again"
	case errors.As(err, &ie):
		return exitIncompatible, msg, ie.hint
	case errors.Is(err, leaseadmin.ErrVersionMismatch), errors.Is(err, leaseadmin.ErrModeMismatch):
		return exitIncompatible, msg, fmt.Sprintf("this pglease ships pg_lease %s; run `pglease version` to compare with the database", leaseadmin.Version)
	case errors.Is(err, lease.ErrNotInstalled):
		return exitNotInstalled, msg, "run `pglease install` (or `pglease install --schema-only` where CREATE EXTENSION is not allowed)"
	case errors.Is(err, errNotFound):
		return exitNotFound, msg, ""
	case sqlState(err) == "42501":
		return exitDenied, "permission denied: " + pgMessage(err), a.permissionHint()
	case sqlState(err) == "25006" || (sqlState(err) == "55000" && strings.Contains(pgMessage(err), "recovery is in progress")):
		return exitError, msg, "the server is a standby or read-only: connect to the primary (target_session_attrs=read-write)"
	}
	return exitError, msg, ""
}

// permissionHint names what the failed operation needs.
func (a *app) permissionHint() string {
	switch a.op {
	case "install":
		return fmt.Sprintf("installing needs CREATE on the database: have its owner or a superuser run `pglease install`, or GRANT CREATE ON DATABASE %s TO %s", a.database(), a.user())
	case "force_release":
		return fmt.Sprintf("an operator must GRANT EXECUTE ON FUNCTION lease.force_release(text) TO %s", a.user())
	case "cleanup":
		return fmt.Sprintf("an operator must GRANT EXECUTE ON FUNCTION lease.cleanup(interval, integer) TO %s", a.user())
	}
	return fmt.Sprintf("%s lacks a privilege on pg_lease's objects (USAGE on schema lease, EXECUTE on its functions): see docs/operations.md", a.user())
}

// incompatibleError: the installed pg_lease cannot do what was asked (exit 6).
type incompatibleError struct {
	msg, hint string
}

func (e *incompatibleError) Error() string { return e.msg }
