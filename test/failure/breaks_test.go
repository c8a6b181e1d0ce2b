package failure

import (
	"os"
	"strings"
	"testing"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// EnvBreak names the deliberate break to run the suite against (see
// README.md). Empty: the real pg_lease.
const EnvBreak = "PGLEASE_FAILURE_BREAK"

// EnvSQL names a file to install instead of the repository's script (as a
// plain schema): an extension script, base and update scripts concatenated,
// with its \echo guard lines and @extowner@ placeholders (hack/defects.sh
// points it at deliberately broken copies). Empty: the repository's.
const EnvSQL = "PGLEASE_FAILURE_SQL"

// scriptFile reads the script named by EnvSQL for a plain-schema install:
// psql meta-command lines dropped, @extowner@ replaced by the superuser.
func scriptFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", EnvSQL, err)
	}
	var sb strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), `\`) {
			sb.WriteString(l)
		}
	}
	return strings.ReplaceAll(sb.String(), "@extowner@", `"`+pgtest.Superuser+`"`)
}

// A break is a deliberate defect: either in pg_lease's SQL (sql is applied to
// the install script, which the test then installs as a plain schema in its
// own database) or in a test's own guard (sql is nil; the test consults
// breakIs).
type breakDef struct {
	name string
	what string
	sql  func(t *testing.T, s string) string
}

var breaks = []breakDef{
	{
		name: "uptime_clock",
		what: "server time is the time since the postmaster started: a clock that restarts with the server",
		sql: func(t *testing.T, s string) string {
			s = strings.ReplaceAll(s, "clock_timestamp()", "lease._uclock()")
			return replaceOnce(t, s, "CREATE TABLE lease.leases (",
				"CREATE FUNCTION lease._uclock() RETURNS timestamptz LANGUAGE sql VOLATILE\n"+
					"AS $$ SELECT timestamptz 'epoch' + (pg_catalog.clock_timestamp() - pg_catalog.pg_postmaster_start_time()) $$;\n"+
					"CREATE TABLE lease.leases (")
		},
	},
	{
		name: "unlogged_table",
		what: "lease.leases is UNLOGGED: kept across a clean shutdown, emptied by crash recovery",
		sql: func(t *testing.T, s string) string {
			return replaceOnce(t, s, "CREATE TABLE lease.leases (", "CREATE UNLOGGED TABLE lease.leases (")
		},
	},
	{
		name: "freed_on_session_death",
		what: "a grant whose acquiring backend has exited counts as free (advisory-lock semantics)",
		sql: func(t *testing.T, s string) string {
			s = replaceOnce(t, s, ") WITH (fillfactor = 50);",
				") WITH (fillfactor = 50);\nALTER TABLE lease.leases ADD COLUMN holder_pid int DEFAULT pg_backend_pid();")
			s = replaceIn(t, s, "acquire", "SELECT l.owner, l.epoch, l.expires_at INTO r_owner, r_epoch, r_expires",
				"SELECT l.owner, l.epoch, CASE WHEN EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.holder_pid)\n"+
					"        THEN l.expires_at ELSE '-infinity' END INTO r_owner, r_epoch, r_expires", 2)
			return replaceIn(t, s, "acquire", "SET owner = v_owner, epoch = l.epoch + 1,",
				"SET owner = v_owner, epoch = l.epoch + 1, holder_pid = pg_backend_pid(),", 1)
		},
	},
	{
		name: "takeover_keeps_epoch",
		what: "acquire of a free or lapsed key keeps the row's epoch instead of incrementing it",
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "acquire", "SET owner = v_owner, epoch = l.epoch + 1,", "SET owner = v_owner, epoch = l.epoch,", 1)
		},
	},
	{
		name: "session_advisory_lock",
		what: "acquire also takes a session-level advisory lock on the key (non-transactional: survives rollback) and denies when another session has it",
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "acquire", "  v_ttl := lease._seconds(ttl);\n",
				"  v_ttl := lease._seconds(ttl);\n"+
					"  IF NOT pg_try_advisory_lock(hashtext(v_key)) THEN\n"+
					"    acquired := false; epoch := NULL; expires_at := NULL; RETURN;\n"+
					"  END IF;\n", 1)
		},
	},
	{
		name: "early_takeover",
		what: "acquire treats a grant as lapsed 100 ms before its expiry",
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "acquire", "IF r_owner IS NOT NULL AND r_expires > v_now THEN",
				"IF r_owner IS NOT NULL AND r_expires - interval '100 milliseconds' > v_now THEN", 2)
		},
	},
	{
		name: "epoch_from_clock",
		what: "a takeover's epoch is the server clock in milliseconds (a timestamp as fencing token)",
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "acquire", "SET owner = v_owner, epoch = l.epoch + 1,",
				"SET owner = v_owner, epoch = (extract(epoch FROM v_now) * 1000)::bigint - 1700000000000,", 1)
		},
	},
	{
		name: "wait_swallows_cancel",
		what: "the blocking acquire's sleep catches query_canceled and keeps waiting",
		sql: func(t *testing.T, s string) string {
			s = replaceIn(t, s, "acquire", "    PERFORM pg_sleep(greatest(", "    BEGIN PERFORM pg_sleep(greatest(", 1)
			return replaceIn(t, s, "acquire", "extract(epoch FROM r_expires - v_now)::double precision)));\n",
				"extract(epoch FROM r_expires - v_now)::double precision)));\n"+
					"    EXCEPTION WHEN query_canceled THEN NULL; END;\n", 1)
		},
	},
	{
		name: "lock_error_swallowed",
		what: "renew catches lock_not_available and reports ok with a computed expiry (fail-open)",
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "renew", "  EXCEPTION WHEN SQLSTATE 'LEASE' THEN\n",
				"  EXCEPTION WHEN SQLSTATE 'LEASE' OR lock_not_available THEN\n"+
					"    IF status IS NULL THEN status := 'ok'; expires_at := clock_timestamp() + v_ttl; RETURN; END IF;\n", 1)
		},
	},
	{
		name: "no_sync_forcing",
		what: "lease._changed no longer raises synchronous_commit from off to local",
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "_changed", "    PERFORM set_config('synchronous_commit', 'local', true);\n",
				"    NULL;\n", 1)
		},
	},
	{
		name: "guard_no_epoch_check",
		what: "test guard: the watermark guard's UPDATE has no epoch condition",
	},
	{
		name: "guard_fail_open",
		what: "test guard: the worker treats a failed acquire call (connection refused) as permission to act",
	},
}

// activeBreak returns the break named by PGLEASE_FAILURE_BREAK when it is a
// break of the SQL, nil otherwise; it fails the test on an unknown name.
func activeBreak(t *testing.T) *breakDef {
	t.Helper()
	name := os.Getenv(EnvBreak)
	if name == "" {
		return nil
	}
	for i := range breaks {
		if breaks[i].name == name {
			if breaks[i].sql == nil {
				return nil
			}
			return &breaks[i]
		}
	}
	t.Fatalf("%s=%q: no such break", EnvBreak, name)
	return nil
}

// breakIs reports whether the test-guard break name is active.
func breakIs(t *testing.T, name string) bool {
	if os.Getenv(EnvBreak) == name {
		t.Logf("BREAK %s active", name)
		return true
	}
	return false
}

func (b *breakDef) apply(t *testing.T, s string) string {
	t.Helper()
	out := b.sql(t, s)
	if out == s {
		t.Fatalf("break %s changed nothing", b.name)
	}
	return out
}

func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if strings.Count(s, old) != 1 {
		t.Fatalf("break: %q occurs %d times in the script, want 1", old, strings.Count(s, old))
	}
	return strings.Replace(s, old, new, 1)
}

// replaceIn replaces the n occurrences of old in the body of function
// lease.<fn> (up to the next CREATE FUNCTION), failing unless there are
// exactly n.
func replaceIn(t *testing.T, s, fn, old, new string, n int) string {
	t.Helper()
	a := strings.Index(s, "CREATE FUNCTION lease."+fn+"(")
	if a < 0 {
		t.Fatalf("break: no function lease.%s", fn)
	}
	b := strings.Index(s[a+1:], "CREATE FUNCTION")
	if b < 0 {
		b = len(s)
	} else {
		b += a + 1
	}
	body := s[a:b]
	if c := strings.Count(body, old); c != n {
		t.Fatalf("break: %q occurs %d times in lease.%s, want %d", old, c, fn, n)
	}
	return s[:a] + strings.ReplaceAll(body, old, new) + s[b:]
}
