package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/pglease/pg_lease/pkg/lease"
	"github.com/pglease/pg_lease/pkg/leaseadmin"

	"github.com/pglease/pg_lease/internal/pgerr"
)

// connectError is a failed connection attempt, printed on one line: each
// distinct reason once, per address, without the "tls error: server refused
// TLS connection" of a sslmode=prefer attempt that then went on in plain
// text (pgconn reports every attempt).
type connectError struct {
	err error
}

func (e *connectError) Unwrap() error { return e.err }

func (e *connectError) Error() string {
	return "cannot connect: " + connectReason(e.err)
}

// connectReason reduces a pgconn connect error to "addr: reason; addr: reason".
func connectReason(err error) string {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return oneLine(err.Error())
	}
	inner := errors.Unwrap(ce)
	var attempts []error
	if j, ok := inner.(interface{ Unwrap() []error }); ok {
		attempts = j.Unwrap()
	} else if inner != nil {
		attempts = []error{inner}
	}
	type attempt struct{ addr, reason string }
	var all []attempt
	for _, at := range attempts {
		addr, reason := splitAttempt(at)
		all = append(all, attempt{addr, reason})
	}
	// Drop a refused TLS attempt when the same address was then tried again
	// (sslmode=prefer falls back to plain text).
	var kept []attempt
	for i, at := range all {
		if strings.Contains(at.reason, "server refused TLS connection") {
			later := false
			for _, o := range all[i+1:] {
				if o.addr == at.addr {
					later = true
				}
			}
			if later {
				continue
			}
		}
		kept = append(kept, at)
	}
	// One line per distinct reason: the addresses that gave it, then it.
	var order []string
	byReason := map[string][]string{}
	for _, at := range kept {
		if _, ok := byReason[at.reason]; !ok {
			order = append(order, at.reason)
		}
		addrs := byReason[at.reason]
		if at.addr != "" && !contains(addrs, at.addr) {
			addrs = append(addrs, at.addr)
		}
		byReason[at.reason] = addrs
	}
	var parts []string
	for _, r := range order {
		if addrs := byReason[r]; len(addrs) > 0 {
			parts = append(parts, strings.Join(addrs, ", ")+": "+r)
		} else {
			parts = append(parts, r)
		}
	}
	if len(parts) == 0 {
		return oneLine(inner.Error())
	}
	who := "user=" + ce.Config.User + " database=" + ce.Config.Database
	return who + ": " + strings.Join(parts, "; ")
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// splitAttempt splits one attempt's error ("127.0.0.1:5432 (localhost):
// dial error: dial tcp ...: connect: connection refused") into its address
// and its shortest honest reason.
func splitAttempt(err error) (addr, reason string) {
	text := err.Error()
	if inner := errors.Unwrap(err); inner != nil {
		if p, ok := strings.CutSuffix(text, ": "+inner.Error()); ok {
			addr = p
			if i := strings.Index(addr, " ("); i > 0 {
				addr = addr[:i]
			}
		}
	}
	var pg *pgconn.PgError
	var op *net.OpError
	var dns *net.DNSError
	switch {
	case errors.As(err, &pg):
		reason = pg.Severity + ": " + pg.Message + " (SQLSTATE " + pg.Code + ")"
	case errors.As(err, &dns):
		reason = "cannot resolve host " + dns.Name + ": " + dns.Err
	case errors.As(err, &op) && op.Err != nil:
		reason = op.Err.Error()
		var se interface{ Unwrap() error }
		if errors.As(op.Err, &se) && se.Unwrap() != nil {
			reason = se.Unwrap().Error()
		}
	case pgconn.Timeout(err):
		reason = "timed out"
	default:
		reason = text
		if addr != "" {
			reason = strings.TrimPrefix(text, addr)
			if i := strings.Index(reason, "): "); strings.HasPrefix(reason, " (") && i > 0 {
				reason = reason[i+3:]
			}
			reason = strings.TrimPrefix(reason, ": ")
		}
	}
	return addr, oneLine(reason)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// parseErrorText is the reason a connection string did not parse, without
// the string itself (pgx's message quotes it, password masking being best
// effort there).
func parseErrorText(dsn string, err error) string {
	inner := errors.Unwrap(err)
	if inner == nil {
		return "cannot parse (not shown: it may contain a password)"
	}
	text := oneLine(inner.Error())
	for _, secret := range passwordCandidates(dsn) {
		if secret != "" && strings.Contains(text, secret) {
			return "cannot parse (not shown: it may contain a password)"
		}
	}
	return text
}

var passwordKV = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// passwordCandidates are the substrings of dsn that may be a password.
func passwordCandidates(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			out = append(out, p)
		}
	}
	if i := strings.Index(dsn, "://"); i >= 0 {
		rest := dsn[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			userinfo := rest[:at]
			if c := strings.Index(userinfo, ":"); c >= 0 {
				out = append(out, userinfo[c+1:])
			}
		}
	}
	for _, m := range passwordKV.FindAllStringSubmatch(dsn, -1) {
		out = append(out, strings.Trim(m[1], "'"))
	}
	for _, kv := range strings.Split(dsn, "&") {
		if v, ok := strings.CutPrefix(kv, "password="); ok {
			out = append(out, v)
		}
	}
	return out
}

// sqlState is the SQLSTATE of the server error in err's chain, or "".
func sqlState(err error) string { return pgerr.Code(err) }

// pgMessage is the server error's message, or err's text when there is none.
func pgMessage(err error) string {
	if pg, ok := pgerr.As(err); ok {
		return pg.Message
	}
	return err.Error()
}

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

// codedError ends the invocation with its own exit status.
type codedError struct {
	code      int
	msg, hint string
}

func (e *codedError) Error() string { return e.msg }

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
