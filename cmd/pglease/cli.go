package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"sigs.k8s.io/yaml"

	"github.com/pglease/pg_lease/pkg/lease"
)

// Exit codes.
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitNotInstalled = 3
	exitDenied       = 4
	exitNotFound     = 5
)

const usage = `pglease: operate pg_lease leases

Usage:
  pglease [global flags] install [--schema-only]
  pglease [global flags] version
  pglease [global flags] get KEY [-o table|json|yaml]
  pglease [global flags] list [-o table|json|yaml]
  pglease [global flags] watch [KEY...]
  pglease [global flags] release --force KEY

Global flags:
  --dsn string   connection string (default $PGLEASE_DSN, else the libpq
                 environment variables PGHOST, PGPORT, PGUSER, ...)
  -v             print what is being done (never passwords) on stderr

Exit codes: 0 ok, 1 error, 2 usage or invalid input, 3 pg_lease not installed,
4 permission denied, 5 key never leased.
`

// clientVersion is this command's version: the pg_lease version it speaks.
const clientVersion = lease.Version

type cli struct {
	out, errw io.Writer
	cfg       *pgx.ConnConfig
	verbose   bool
	password  string // redacted from everything printed
}

// run is main without the process: testable in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{out: stdout, errw: stderr}
	fs := flag.NewFlagSet("pglease", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dsn := fs.String("dsn", "", "")
	fs.BoolVar(&c.verbose, "v", false, "")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "pglease: %v\n\n", err)
		}
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if *dsn == "" {
		*dsn = getenv("PGLEASE_DSN")
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	run, ok := map[string]func(context.Context, *pgx.Conn, []string) error{
		"install": c.install,
		"version": c.version,
		"get":     c.get,
		"list":    c.list,
		"watch":   c.watch,
		"release": c.release,
	}[cmd]
	if !ok {
		fmt.Fprintf(stderr, "pglease: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	// Validate arguments before connecting: bad input changes nothing and
	// needs no server.
	if err := checkArgs(cmd, rest); err != nil {
		return c.fail(err)
	}
	cfg, err := pgx.ParseConfig(*dsn)
	if err != nil {
		return c.fail(fmt.Errorf("%w: invalid connection string: %v", errUsage, err))
	}
	c.password = cfg.Password
	c.cfg = cfg
	c.logf("connecting to host=%s port=%d dbname=%s user=%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return c.fail(fmt.Errorf("connecting: %w", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return c.fail(run(ctx, conn, rest))
}

// checkArgs validates a command's arguments with the same parsers the
// command uses, before any connection is made.
func checkArgs(cmd string, args []string) error {
	var keys []string
	switch cmd {
	case "get":
		_, key, err := getArgs(args)
		if err != nil {
			return err
		}
		keys = []string{key}
	case "list":
		if _, err := listArgs(args); err != nil {
			return err
		}
	case "release":
		key, err := releaseArgs(args)
		if err != nil {
			return err
		}
		keys = []string{key}
	case "watch":
		keys = args
	}
	for _, k := range keys {
		if k == "" || len(k) > 1024 {
			return fmt.Errorf("%w: invalid key %q: a key is 1 to 1024 bytes", lease.ErrInvalidInput, k)
		}
	}
	return nil
}

func getArgs(args []string) (format, key string, err error) {
	format, rest, err := parseOutput("get", args)
	if err != nil {
		return "", "", err
	}
	if len(rest) != 1 {
		return "", "", fmt.Errorf("%w: get takes exactly one KEY", errUsage)
	}
	return format, rest[0], nil
}

func listArgs(args []string) (format string, err error) {
	format, rest, err := parseOutput("list", args)
	if err != nil {
		return "", err
	}
	if len(rest) != 0 {
		return "", fmt.Errorf("%w: list takes no KEY", errUsage)
	}
	return format, nil
}

// releaseArgs takes KEY and --force, which may stand before or after it.
func releaseArgs(args []string) (key string, err error) {
	force, keys := false, []string(nil)
	for _, a := range args {
		switch {
		case a == "--force" || a == "-force":
			force = true
		case strings.HasPrefix(a, "-"):
			return "", fmt.Errorf("%w: release: unknown flag %s", errUsage, a)
		default:
			keys = append(keys, a)
		}
	}
	if len(keys) != 1 {
		return "", fmt.Errorf("%w: release --force KEY", errUsage)
	}
	if !force {
		return "", fmt.Errorf("%w: release needs --force: it frees the key whatever its holder and fences that holder (holders release through their own client)", errUsage)
	}
	return keys[0], nil
}

func (c *cli) logf(format string, args ...any) {
	if c.verbose {
		fmt.Fprintln(c.errw, c.redact("pglease: "+fmt.Sprintf(format, args...)))
	}
}

func (c *cli) redact(s string) string {
	if c.password != "" {
		s = strings.ReplaceAll(s, c.password, "xxxxx")
	}
	return s
}

// fail prints err (redacted) and maps it to an exit code.
func (c *cli) fail(err error) int {
	if err == nil {
		return exitOK
	}
	code := exitError
	var pg *pgconn.PgError
	switch {
	case errors.Is(err, errUsage), errors.Is(err, lease.ErrInvalidInput):
		code = exitUsage
	case errors.Is(err, lease.ErrNotInstalled):
		code = exitNotInstalled
		err = fmt.Errorf("%w\nhint: run `pglease install` (or `pglease install --schema-only` where CREATE EXTENSION is not allowed)", err)
	case errors.Is(err, errNotFound):
		code = exitNotFound
	case errors.As(err, &pg) && pg.Code == "42501":
		code = exitDenied
		err = fmt.Errorf("permission denied: %s\nhint: an operator must GRANT EXECUTE ON FUNCTION lease.force_release(text) TO this role", pg.Message)
	case errors.Is(err, context.Canceled):
		return exitOK // interrupted watch
	}
	fmt.Fprintln(c.errw, c.redact("pglease: "+err.Error()))
	return code
}

var errNotFound = errors.New("key was never leased")

// parseOutput takes -o/--output (anywhere among args, as kubectl does) and
// returns the format and the other arguments.
func parseOutput(name string, args []string) (string, []string, error) {
	format := "table"
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" || a == "--output" || a == "-output":
			if i+1 >= len(args) {
				return "", nil, fmt.Errorf("%w: %s: %s needs a value", errUsage, name, a)
			}
			format = args[i+1]
			i++
		case strings.HasPrefix(a, "-o=") || strings.HasPrefix(a, "--output="):
			format = a[strings.Index(a, "=")+1:]
		case strings.HasPrefix(a, "-"):
			return "", nil, fmt.Errorf("%w: %s: unknown flag %s", errUsage, name, a)
		default:
			rest = append(rest, a)
		}
	}
	switch format {
	case "table", "json", "yaml":
	default:
		return "", nil, fmt.Errorf("%w: -o %q: want table, json or yaml", errUsage, format)
	}
	return format, rest, nil
}

func (c *cli) install(ctx context.Context, conn *pgx.Conn, args []string) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	schemaOnly := fs.Bool("schema-only", false, "")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return fmt.Errorf("%w: install [--schema-only]", errUsage)
	}
	var err error
	if *schemaOnly {
		c.logf("installing pg_lease %s as a plain schema", lease.Version)
		err = lease.InstallSchema(ctx, conn)
	} else {
		c.logf("CREATE EXTENSION pg_lease (version %s)", lease.Version)
		err = lease.InstallExtension(ctx, conn)
	}
	if err != nil {
		return err
	}
	v, mode, err := lease.Installed(ctx, conn)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "pg_lease %s installed (%s) in database %s\n", v, mode, conn.Config().Database)
	return nil
}

func (c *cli) version(ctx context.Context, conn *pgx.Conn, args []string) error {
	if len(args) != 0 {
		return fmt.Errorf("%w: version takes no arguments", errUsage)
	}
	var server string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&server); err != nil {
		return err
	}
	sqlv, mode, err := lease.Installed(ctx, conn)
	if err != nil && !errors.Is(err, lease.ErrNotInstalled) {
		return err
	}
	if sqlv == "" {
		sqlv = "not installed"
	} else {
		sqlv += " (" + mode.String() + ")"
	}
	fmt.Fprintf(c.out, "client:  %s\nsql:     %s\nserver:  PostgreSQL %s\n", clientVersion, sqlv, server)
	return nil
}

// row is one key as get and list print it.
type row struct {
	Key        string     `json:"key"`
	Held       bool       `json:"held"`
	Holder     string     `json:"holder,omitempty"`
	Epoch      int64      `json:"epoch"`
	AcquiredAt *time.Time `json:"acquiredAt,omitempty"`
	ExpiresAt  *time.Time `json:"expiresAt,omitempty"`
	// Remaining is the server-side time left, at the server's clock when read.
	Remaining string `json:"remaining,omitempty"`
}

func toRow(s lease.State) row {
	r := row{Key: s.Key, Held: s.Held, Holder: s.Owner, Epoch: s.Epoch}
	if s.Held {
		e := s.ExpiresAt
		r.ExpiresAt = &e
		r.Remaining = s.ExpiresAt.Sub(s.ServerNow).Round(time.Millisecond).String()
		if !s.AcquiredAt.IsZero() {
			a := s.AcquiredAt
			r.AcquiredAt = &a
		}
	}
	return r
}

func (c *cli) print(format string, rows []row, single bool) error {
	switch format {
	case "json":
		var v any = rows
		if single {
			v = rows[0]
		}
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.out, string(b))
		return err
	case "yaml":
		var v any = rows
		if single {
			v = rows[0]
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = c.out.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHOLDER\tEPOCH\tEXPIRES\tREMAINING")
	for _, r := range rows {
		holder, expires, remaining := "<none>", "-", "-"
		if r.Held {
			holder, expires, remaining = r.Holder, r.ExpiresAt.UTC().Format(time.RFC3339Nano), r.Remaining
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Key, holder, r.Epoch, expires, remaining)
	}
	return tw.Flush()
}

func (c *cli) get(ctx context.Context, conn *pgx.Conn, args []string) error {
	format, key, err := getArgs(args)
	if err != nil {
		return err
	}
	s, err := lease.New(conn).Inspect(ctx, key)
	if err != nil {
		return err
	}
	if !s.Exists {
		return fmt.Errorf("%w: %q", errNotFound, key)
	}
	return c.print(format, []row{toRow(s)}, true)
}

func (c *cli) list(ctx context.Context, conn *pgx.Conn, args []string) error {
	format, err := listArgs(args)
	if err != nil {
		return err
	}
	states, err := lease.New(conn).List(ctx)
	if err != nil {
		return err
	}
	rows := make([]row, 0, len(states))
	for _, s := range states {
		rows = append(rows, toRow(s))
	}
	return c.print(format, rows, false)
}

func (c *cli) release(ctx context.Context, conn *pgx.Conn, args []string) error {
	key, err := releaseArgs(args)
	if err != nil {
		return err
	}
	released, prev, epoch, err := lease.New(conn).ForceRelease(ctx, key)
	if err != nil {
		return err
	}
	if !released {
		fmt.Fprintf(c.out, "%s: not held; nothing to release (epoch counter %d)\n", key, epoch)
		return nil
	}
	fmt.Fprintf(c.out, "%s: released (was held by %s); epoch counter now %d, so every epoch below it is fenced\n", key, prev, epoch)
	return nil
}
