package hardening

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	pgleasesql "github.com/pglease/pg_lease/sql"
)

// installScripts are the scripts an install or update path runs: the full
// script of the current version and the direct update scripts to it.
func installScripts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, b := range pgleasesql.Files() {
		if strings.HasSuffix(name, "--"+pgleasesql.Version+".sql") {
			out[name] = string(b)
		}
	}
	if len(out) != 5 {
		t.Fatalf("%d scripts to %s, want 5 (the full script and four direct updates)", len(out), pgleasesql.Version)
	}
	return out
}

// installTimeSQL returns the parts of script that run at install time, with
// comments removed and string literals emptied: every statement but the
// CREATE FUNCTION statements (their bodies run later, under the functions'
// own pinned search_path), the bodies of DO blocks included.
func installTimeSQL(script string) []string {
	var stmts []string
	script = strings.ReplaceAll(script, "@extowner@", "extowner")
	lines := strings.Split(script, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), `\`) {
			lines[i] = "" // the psql guard (\echo ... \quit)
		}
	}
	for _, st := range splitStatements(strings.Join(lines, "\n")) {
		up := strings.ToUpper(strings.Join(strings.Fields(st.text), " "))
		if strings.HasPrefix(up, "CREATE FUNCTION") || strings.HasPrefix(up, "CREATE OR REPLACE FUNCTION") {
			continue
		}
		stmts = append(stmts, st.text+" "+strings.Join(st.bodies, " "))
	}
	return stmts
}

type statement struct {
	text   string   // outside dollar quotes, strings emptied
	bodies []string // the dollar-quoted parts, comments removed, strings emptied
}

// splitStatements splits a script at top-level semicolons, dropping
// comments and emptying string literals, and keeps dollar-quoted bodies
// apart (a DO block's body is PL/pgSQL, scanned the same way).
func splitStatements(s string) []statement {
	var out []statement
	var cur, body strings.Builder
	var bodies []string
	inBody := ""
	for i := 0; i < len(s); {
		c := s[i]
		w := &cur
		if inBody != "" {
			w = &body
			if strings.HasPrefix(s[i:], inBody) {
				bodies = append(bodies, body.String())
				body.Reset()
				i += len(inBody)
				inBody = ""
				cur.WriteString(" $body$ ")
				continue
			}
		}
		switch {
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			for i < len(s) && s[i] != '\n' {
				i++
			}
			continue
		case c == '\'':
			j := i + 1
			for j < len(s) {
				if s[j] == '\'' {
					if j+1 < len(s) && s[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			w.WriteString("''")
			i = j + 1
			continue
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			w.WriteString(s[i : i+j+2])
			i += j + 2
			continue
		case c == '$' && inBody == "":
			if m := dollarTag.FindString(s[i:]); m != "" {
				inBody = m
				i += len(m)
				continue
			}
		case c == ';' && inBody == "":
			out = append(out, statement{text: cur.String(), bodies: bodies})
			cur.Reset()
			bodies = nil
			i++
			continue
		}
		w.WriteByte(c)
		i++
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, statement{text: cur.String(), bodies: bodies})
	}
	return out
}

var (
	dollarTag = regexp.MustCompile(`^\$[A-Za-z_]*\$`)
	// call: a name followed by "(", with what precedes it (a dot: qualified).
	call = regexp.MustCompile(`(\.?"?)([A-Za-z_][A-Za-z0-9_]*)"?\s*\(`)
	// operator: a run of operator characters.
	operator = regexp.MustCompile(`[+\-*/<>=~!@#%^&|?]+`)
	// qualifiedOperator: OPERATOR(pg_catalog.x), removed before the scan.
	qualifiedOperator = regexp.MustCompile(`OPERATOR\(pg_catalog\.[^)]+\)`)
	// keywordOperator: SQL syntax that compares through an operator that
	// search_path resolves (IN with a list, BETWEEN, LIKE, IS DISTINCT FROM).
	keywordOperator = regexp.MustCompile(`(?i)\bIN\s*\(\s*[^sS\s]|\bBETWEEN\b|\bI?LIKE\b|\bSIMILAR\s+TO\b|\bDISTINCT\s+FROM\b`)
	// reloptions: WITH (name = value, ...), not operators.
	reloptions = regexp.MustCompile(`(?i)WITH\s*\([a-z_]+\s*=\s*[0-9a-z_]+\)`)
)

// syntax: words followed by "(" that are SQL or PL/pgSQL syntax, not names
// that PostgreSQL looks up in search_path. (COALESCE, GREATEST, LEAST,
// NULLIF and EXTRACT are syntax too: they never resolve to a user's function.)
var syntax = map[string]bool{
	"VALUES": true, "KEY": true, "CHECK": true, "IN": true, "ANY": true, "ALL": true,
	"EXISTS": true, "WITH": true, "ARRAY": true, "ROW": true, "COALESCE": true,
	"GREATEST": true, "LEAST": true, "NULLIF": true, "CAST": true, "EXTRACT": true,
	"OPERATOR": true, "FILTER": true, "OVER": true, "UNIQUE": true, "AS": true, "FROM": true, "AND": true,
	"OR": true, "NOT": true, "THEN": true, "ELSE": true, "WHEN": true, "SELECT": true,
	"WHERE": true, "ON": true, "USING": true, "RETURNING": true, "JOIN": true,
}

// updateSet: the assignment of an UPDATE's SET column = ..., not an operator.
var updateSet = regexp.MustCompile(`(?i)\bSET\s+[a-z_][a-z0-9_]*\s*=`)

// scriptCalls returns, over every install-time statement of script, the
// names called unqualified, the names called qualified (their base names),
// and the operators used outside OPERATOR(pg_catalog.x).
func scriptCalls(script string) (unqualified, qualified, operators []string) {
	uq, q, ops := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, st := range installTimeSQL(script) {
		for _, m := range call.FindAllStringSubmatch(st, -1) {
			name := m[2]
			switch {
			case strings.HasPrefix(m[1], "."):
				q[strings.ToLower(name)] = true
			case !syntax[strings.ToUpper(name)]:
				uq[strings.ToLower(name)] = true
			}
		}
		rest := qualifiedOperator.ReplaceAllString(st, " ")
		for _, m := range qualifiedOperator.FindAllString(st, -1) {
			q["operator "+strings.TrimSuffix(strings.TrimPrefix(m, "OPERATOR(pg_catalog."), ")")] = true
		}
		rest = reloptions.ReplaceAllString(rest, " ")
		rest = strings.ReplaceAll(rest, ":=", " ")   // PL/pgSQL assignment
		rest = updateSet.ReplaceAllString(rest, " ") // UPDATE ... SET column = (an assignment)
		rest = strings.ReplaceAll(rest, "=>", " ")   // named argument
		rest = strings.ReplaceAll(rest, "(*)", " ")
		rest = regexp.MustCompile(`(?i)SELECT\s+\*`).ReplaceAllString(rest, " ")
		for _, op := range operator.FindAllString(rest, -1) {
			ops[op] = true
		}
		// Operators written as keywords: IN (a list), BETWEEN, LIKE ...
		for _, m := range keywordOperator.FindAllString(rest, -1) {
			ops[strings.ToUpper(strings.Join(strings.Fields(m), " "))] = true
		}
	}
	return keys(uq), keys(q), keys(ops)
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestInstallTimeSQLQualified: the statements every install and update
// script runs at install time call no function and use no operator that
// another role could shadow: every one is pg_catalog's, named in full
// (pg_catalog.f(...), OPERATOR(pg_catalog.=)), or pg_lease's own (lease.f).
func TestInstallTimeSQLQualified(t *testing.T) {
	for name, script := range installScripts(t) {
		uq, q, ops := scriptCalls(script)
		if len(uq) > 0 {
			t.Errorf("%s: unqualified calls at install time: %v (write pg_catalog.NAME)", name, uq)
		}
		if len(ops) > 0 {
			t.Errorf("%s: unqualified operators at install time: %v (write OPERATOR(pg_catalog.OP))", name, ops)
		}
		if len(q) == 0 {
			t.Errorf("%s: no qualified call found: the scan is broken", name)
		}
	}
}

// TestScanFindsUnqualified: the scan itself sees what it must refuse (a
// check that can fail): the released 0.1.0 -> 0.2.0 script calls format()
// and compares with = unqualified in a DO block.
func TestScanFindsUnqualified(t *testing.T) {
	released := string(pgleasesql.Files()["pg_lease--0.1.0--0.2.0.sql"])
	uq, _, ops := scriptCalls(released)
	if !contains(uq, "format") || !contains(ops, "=") {
		t.Fatalf("the scan missed the released script's unqualified format() or =: calls %v, operators %v", uq, ops)
	}
	_, _, ops = scriptCalls("CREATE TABLE lease.t (a int CHECK (a IN (1, 2) AND a BETWEEN 0 AND 3));")
	if !contains(ops, "IN (1") || !contains(ops, "BETWEEN") {
		t.Fatalf("the scan missed IN (a list) or BETWEEN: %v", ops)
	}
	// Function bodies are left out; DO blocks are scanned.
	uq, _, _ = scriptCalls("CREATE FUNCTION lease.f() RETURNS int LANGUAGE sql AS $$ SELECT abs(1) $$;\nDO $$ BEGIN PERFORM lower('x'); END $$;")
	if contains(uq, "abs") || !contains(uq, "lower") {
		t.Fatalf("function bodies or DO blocks scanned wrongly: %v", uq)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
