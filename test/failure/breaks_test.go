package failure

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pglease/pg_lease/internal/pgtest"
	pgleasesql "github.com/pglease/pg_lease/sql"
)

// EnvBreak names the deliberate break to run the suite against (see
// README.md). Empty: the real pg_lease.
const EnvBreak = "PGLEASE_FAILURE_BREAK"

// EnvSQL names a file to install instead of the repository's script (as a
// plain schema): an extension script, base and update scripts concatenated,
// with its \echo guard lines and @extowner@ placeholders (hack/defects.sh
// points it at deliberately broken copies). Empty: the repository's.
const EnvSQL = "PGLEASE_FAILURE_SQL"

// A break is a deliberate defect: either in pg_lease's SQL (sql is applied to
// the install script, which the test then installs as a plain schema in its
// own database) or in a test's own guard (sql is nil; the test consults
// breakIs). fns names every function whose final definition (the one the
// script leaves installed) a SQL break changes; TestBreaksTakeEffect checks
// that it changes exactly those and that no definition it patches is
// replaced later in the script. A break of the whole script that changes no
// function (unlogged_table) has none. A break of every function that uses
// some text names that text in fnsUsing instead of listing the functions.
type breakDef struct {
	name     string
	what     string
	fns      []string
	fnsUsing string
	sql      func(t *testing.T, s string) string
}

var breaks = []breakDef{
	{
		name:     "uptime_clock",
		what:     "server time is the time since the postmaster started: a clock that restarts with the server",
		fnsUsing: "clock_timestamp()",
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
		fns:  []string{"acquire"},
		sql: func(t *testing.T, s string) string {
			const alive = "CASE WHEN EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.holder_pid)\n" +
				"        THEN l.expires_at ELSE '-infinity' END"
			s = replaceOnce(t, s, ") WITH (fillfactor = 50);",
				") WITH (fillfactor = 50);\nALTER TABLE lease.leases ADD COLUMN holder_pid int DEFAULT pg_backend_pid();")
			// the unlocked read, then the locked re-reads of a free or lapsed
			// key (NOWAIT for wait 0, waiting otherwise)
			// (a wait-0 grant's one-statement common case locks only a row
			// that is free or lapsed by its expiry: such a grant goes the full
			// way, through the locked re-read)
			s = replaceIn(t, s, "acquire",
				"SELECT l.key IS NOT NULL, l.owner, l.epoch, l.expires_at, l.holder_role,",
				"SELECT l.key IS NOT NULL, l.owner, l.epoch, "+alive+", l.holder_role,", 1)
			s = replaceIn(t, s, "acquire", "SELECT l.owner, l.epoch, l.expires_at INTO r_owner, r_epoch, r_expires",
				"SELECT l.owner, l.epoch, "+alive+" INTO r_owner, r_epoch, r_expires", 2)
			// a first grant gets the column's default; a takeover sets it
			// (both ways: the common case and the full one)
			return replaceIn(t, s, "acquire", "SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1,",
				"SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1, holder_pid = pg_backend_pid(),", 2)
		},
	},
	{
		name: "takeover_keeps_epoch",
		what: "acquire of a free or lapsed key keeps the row's epoch instead of incrementing it",
		fns:  []string{"acquire"},
		sql: func(t *testing.T, s string) string {
			// the common case (wait 0) and the full way
			return replaceIn(t, s, "acquire", "SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1,",
				"SET owner = v_owner, epoch = greatest(l.epoch, v_base),", 2)
		},
	},
	{
		name: "session_advisory_lock",
		what: "acquire also takes a session-level advisory lock on the key (non-transactional: survives rollback) and denies when another session has it",
		fns:  []string{"acquire"},
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
		fns:  []string{"acquire"},
		sql: func(t *testing.T, s string) string {
			// the unlocked read's test (IF v_found AND r_owner ...) and the
			// locked re-read's
			return replaceIn(t, s, "acquire", "r_owner IS NOT NULL AND r_expires > v_now THEN",
				"r_owner IS NOT NULL AND r_expires - interval '100 milliseconds' > v_now THEN", 2)
		},
	},
	{
		name: "epoch_from_clock",
		what: "a takeover's epoch is the server clock in milliseconds (a timestamp as fencing token)",
		fns:  []string{"acquire"},
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "acquire", "SET owner = v_owner, epoch = greatest(l.epoch, v_base) + 1,",
				"SET owner = v_owner, epoch = (extract(epoch FROM v_now) * 1000)::bigint - 1700000000000,", 2)
		},
	},
	{
		name: "wait_swallows_cancel",
		what: "the blocking acquire's sleep catches query_canceled and keeps waiting",
		fns:  []string{"acquire"},
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
		fns:  []string{"renew"},
		sql: func(t *testing.T, s string) string {
			return replaceIn(t, s, "renew", "  EXCEPTION WHEN SQLSTATE 'LEASE' THEN\n",
				"  EXCEPTION WHEN SQLSTATE 'LEASE' OR lock_not_available THEN\n"+
					"    IF status IS NULL THEN status := 'ok'; expires_at := clock_timestamp() + v_ttl; RETURN; END IF;\n", 1)
		},
	},
	{
		name: "no_sync_forcing",
		what: "lease._changed (and its copies in acquire and in the common case of release) no longer raises synchronous_commit from off or local to on",
		fns:  []string{"_changed", "acquire", "release"},
		sql: func(t *testing.T, s string) string {
			s = replaceIn(t, s, "_changed", "    PERFORM set_config('synchronous_commit', 'on', true);\n",
				"    NULL;\n", 1)
			// acquire has it on its fast path and on its first and locked
			// grants; release on its common case.
			for fn, n := range map[string]int{"acquire": 2, "release": 1} {
				s = replaceIn(t, s, fn, "PERFORM set_config('synchronous_commit', 'on', true);  -- as lease._changed\n",
					"NULL;\n", n)
			}
			return s
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

// createFunction matches every CREATE [OR REPLACE] FUNCTION; group 1 is the
// function's name when it is in schema lease.
var createFunction = regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?:lease\.(\w+)\s*\()?`)

// funcDef is one definition of a function of schema lease in a script: the
// text from its CREATE [OR REPLACE] FUNCTION up to the next one (or the end),
// and stmt, the end of its own statement (the closing $$ of its body; end
// when there is none).
type funcDef struct {
	name             string
	start, stmt, end int
}

// funcDefs returns every definition of a function of schema lease in s, in
// script order.
func funcDefs(s string) []funcDef {
	locs := createFunction.FindAllStringSubmatchIndex(s, -1)
	var defs []funcDef
	for i, l := range locs {
		if l[2] < 0 {
			continue // another schema's function: only ends the previous range
		}
		d := funcDef{name: s[l[2]:l[3]], start: l[0], end: len(s)}
		if i+1 < len(locs) {
			d.end = locs[i+1][0]
		}
		d.stmt = d.end
		if a := strings.Index(s[l[1]:d.end], "$$"); a >= 0 {
			a += l[1] + 2
			if b := strings.Index(s[a:d.end], "$$"); b >= 0 {
				d.stmt = a + b + 2
			}
		}
		defs = append(defs, d)
	}
	return defs
}

// finalDef returns the final definition of lease.<fn> in s: the one that a
// run of the whole script leaves installed.
func finalDef(s, fn string) (funcDef, bool) {
	var last funcDef
	found := false
	for _, d := range funcDefs(s) {
		if d.name == fn {
			last, found = d, true
		}
	}
	return last, found
}

// replaceIn replaces the n occurrences of old in the final definition of
// lease.<fn> (the last CREATE [OR REPLACE] FUNCTION lease.<fn>( of the
// script, up to the next CREATE [OR REPLACE] FUNCTION or the end), failing
// unless there are exactly n. (An earlier definition is replaced by the later
// one when the script runs: patching it would change nothing installed.)
func replaceIn(t *testing.T, s, fn, old, new string, n int) string {
	t.Helper()
	d, ok := finalDef(s, fn)
	if !ok {
		t.Fatalf("break: no function lease.%s", fn)
	}
	body := s[d.start:d.end]
	if c := strings.Count(body, old); c != n {
		t.Fatalf("break: %q occurs %d times in the final definition of lease.%s, want %d", old, c, fn, n)
	}
	return s[:d.start] + strings.ReplaceAll(body, old, new) + s[d.end:]
}

// TestBreaksTakeEffect (no server) applies every SQL break to the install
// script and checks that it changes the final definition of each function it
// names (the one installed), and no other function; and that it changes no
// definition that a later CREATE OR REPLACE FUNCTION of the script replaces
// while leaving the final one as it was. A newer update script that redefines
// a function a break patches makes this fail instead of quietly voiding the
// break (as 0.3.0 once did to breaks written against the 0.1.0 text).
func TestBreaksTakeEffect(t *testing.T) {
	script, err := pgleasesql.SchemaScript(pgtest.Superuser, "")
	if err != nil {
		t.Fatal(err)
	}
	before := defTexts(script)
	n := 0
	for i := range breaks {
		b := &breaks[i]
		if b.sql == nil {
			continue
		}
		n++
		t.Run(b.name, func(t *testing.T) {
			after := defTexts(b.apply(t, script))
			fns := b.fns
			if b.fnsUsing != "" {
				for fn, defs := range before {
					if strings.Contains(defs[len(defs)-1], b.fnsUsing) {
						fns = append(fns, fn)
					}
				}
				if len(fns) < 10 {
					t.Fatalf("%d functions use %q, want at least 10", len(fns), b.fnsUsing)
				}
			}
			for _, fn := range fns {
				if len(before[fn]) == 0 {
					t.Errorf("the break names lease.%s, which the script does not define", fn)
				}
			}
			for fn, old := range before {
				nw := after[fn]
				if len(nw) != len(old) {
					t.Errorf("lease.%s: %d definitions in the script, %d after the break", fn, len(old), len(nw))
					continue
				}
				last := len(old) - 1
				finalChanged := old[last] != nw[last]
				earlierChanged := false
				for j := range last {
					earlierChanged = earlierChanged || old[j] != nw[j]
				}
				switch named := slices.Contains(fns, fn); {
				case named && !finalChanged:
					t.Errorf("the final definition of lease.%s (the one installed) is unchanged by the break", fn)
				case !named && finalChanged:
					t.Errorf("the break changes the final definition of lease.%s, which it does not name (fns)", fn)
				case earlierChanged && !finalChanged:
					t.Errorf("the break changes an earlier definition of lease.%s, which a later one replaces, and not the final one", fn)
				}
			}
		})
	}
	if n < 10 {
		t.Fatalf("%d SQL breaks, want at least 10", n)
	}
}

// defTexts maps each function of schema lease in s to the statements of its
// definitions, in script order (text after a definition's statement, up to
// the next one, is not part of it).
func defTexts(s string) map[string][]string {
	m := map[string][]string{}
	for _, d := range funcDefs(s) {
		m[d.name] = append(m[d.name], s[d.start:d.stmt])
	}
	return m
}
