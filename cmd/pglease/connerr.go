package main

import (
	"errors"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

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

func pgDetail(err error) string {
	if pg, ok := pgerr.As(err); ok && pg.Detail != "" {
		return pg.Detail
	}
	return pgMessage(err)
}
