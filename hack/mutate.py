#!/usr/bin/env python3
"""Mutation testing of pg_lease's SQL.

    hack/mutate.py [--list] [--max N] [--seed S] [--only ID[,ID...]] [--ops OP[,OP...]]
                   [--units UNIT[,UNIT...]] [--skip-units UNIT[,UNIT...]]
                   [--suites regression,isolation,go,upgrade] [--out DIR] [--bindir DIR] [--report-only]

Every mutant is ONE small change to the SQL that CREATE EXTENSION pg_lease runs:
the shortest install path to the control file's default_version. From 0.4.0
on that is one full script (sql/pg_lease--0.5.0.sql today). A mutant inside its
shared part (between the @shared-begin and @shared-end lines) is made in the
direct update scripts too (pg_lease--X--0.5.0.sql carry that part verbatim,
hack/gensql), so every install and update path runs it. On an older chain, a
function is mutated only in its final definition, the last script on that path
that creates it; top-level ACL and ownership statements and DO blocks are
mutated in every script, since all of them run.

Operators (--ops):
  cmp     a comparison operator: < <=, > >=, = <>, <> =  (one site each)
  logic   AND -> OR, OR -> AND
  not     NOT x -> x;  IS NULL <-> IS NOT NULL
  int     an integer literal N -> N-1 and N+1 (off-by-one in epochs, floors, limits)
  bool    true <-> false (e.g. set_config(..., true): a session-wide forcing)
  lock    row-locking clauses: FOR NO KEY UPDATE / FOR UPDATE / FOR SHARE / SKIP LOCKED
          -> a weaker, a stronger, a NOWAIT variant, or none
  clock   clock_timestamp() -> now(), statement_timestamp()
  minmax  least( <-> greatest(
  str     a string literal that carries meaning (a status, an event, an SQLSTATE,
          the synchronous_commit values, the channel) -> another one
  inlist  one element removed from an IN (...) list of literals
  stmt    one PL/pgSQL statement (PERFORM, RAISE, UPDATE, INSERT, DELETE, SELECT ...
          INTO, assignment, CONTINUE, RETURN, EXECUTE) -> NULL;
  attr    SECURITY DEFINER -> SECURITY INVOKER; the SET search_path clause removed
  acl     a top-level REVOKE or GRANT removed, REVOKE ... FROM PUBLIC -> GRANT ... TO
          PUBLIC, an ALTER ... OWNER TO removed

Each mutant is installed into a private copy of the PostgreSQL installation
(copied from --bindir's, default $PGLEASE_PG_BINDIR or pg_config's, into a
temporary directory: the extension directory this writes is never a shared
one), one throwaway cluster serves the whole run (hack/with-postgres.sh), and:

  probe       CREATE EXTENSION pg_lease in a fresh database, and the update path
              from the oldest full script (0.1.0); a mutant that does not install is
              "stillborn" (not counted: it tests nothing)
  regression  PGXS make installcheck ISOLATION=   (sql/test/sql)
  isolation   PGXS make installcheck REGRESS=     (sql/test/specs)
  go          go test ./test/fuzz with PGLEASE_FUZZ_SQL=<the mutant, plain schema>
  upgrade     the upgrade check as hack/test-matrix.sh runs it (sql/test/upgrade:
              0.1.0 and 0.2.0 installed, updated by the installer, by a
              superuser, under default privileges; the regression suite in the
              updated database; the isolation suite on a database updated
              from 0.1.0): the only suite where ALTER EXTENSION UPDATE runs as
              another role than the installer

Suites run in that order and stop at the first that fails: the mutant is
"caught" (failing test names are recorded); "survived" when every suite passes.
A control run (the unmodified SQL) must pass every suite first, else the run
stops (exit 2). With --max N, N mutants are drawn with --seed (default: from
the clock; printed) from the candidates, stratified by operator; the selection
is printed so a run can be repeated (--seed, or --only).

Output: DIR (default /tmp/pg_lease-mutate): plan.json, one log per mutant and
suite, <id>.patch, results.json and table.md (a Markdown summary for
docs/audit/defects.md). Exit 0 when no selected mutant survived, 1 otherwise.
Known-equivalent mutants are listed in hack/mutate-equivalent.txt (ID, the
unit_sha of the function they were checked in, and the reason); they are
reported as "equivalent", not as survivors, while that function's text is
the same. --units NAME,... runs whole functions in the given order (a pass
stopped early then covers whole units); --skip-units leaves some out.
"""
import argparse
import difflib
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SQLDIR = os.path.join(REPO, 'sql')
EQUIV_FILE = os.path.join(REPO, 'hack', 'mutate-equivalent.txt')
ALL_OPS = ['cmp', 'logic', 'not', 'int', 'bool', 'lock', 'clock', 'minmax', 'str',
           'inlist', 'stmt', 'attr', 'acl']
ALL_SUITES = ['regression', 'isolation', 'go', 'upgrade']
SUITE_TIMEOUT = 100  # seconds; the unmodified suites take about 10-35 s each on 2 loaded cores


def die(msg, code=2):
    print('mutate: ' + msg, file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------------------
# The install chain
# ---------------------------------------------------------------------------

def vkey(v):
    return tuple(int(x) if x.isdigit() else x for x in re.split(r'[.]', v))


def chain(sqldir):
    """The scripts CREATE EXTENSION runs for default_version: a base script and
    the update scripts of the shortest path from it (PostgreSQL's rule)."""
    ctl = open(os.path.join(sqldir, 'pg_lease.control')).read()
    m = re.search(r"^\s*default_version\s*=\s*'([^']+)'", ctl, re.M)
    if not m:
        die('no default_version in pg_lease.control')
    target = m.group(1)
    bases, edges = [], {}
    for p in glob.glob(os.path.join(sqldir, 'pg_lease--*.sql')):
        n = os.path.basename(p)[len('pg_lease--'):-len('.sql')]
        if '--' in n:
            a, b = n.split('--')
            edges.setdefault(a, []).append(b)
        else:
            bases.append(n)
    best = None
    for b in sorted(bases, key=vkey, reverse=True):
        # breadth-first: shortest path from b to target
        paths = [[b]]
        seen = {b}
        while paths:
            nxt = []
            for path in paths:
                if path[-1] == target:
                    if best is None or len(path) < len(best):
                        best = path
                    break
                for c in sorted(edges.get(path[-1], []), key=vkey):
                    if c not in seen:
                        seen.add(c)
                        nxt.append(path + [c])
            paths = nxt
    if best is None:
        die('no install path to default_version %s' % target)
    files = ['pg_lease--%s.sql' % best[0]]
    files += ['pg_lease--%s--%s.sql' % (a, b) for a, b in zip(best, best[1:])]
    return target, files


# ---------------------------------------------------------------------------
# A small SQL lexer: which characters are code (not a comment, not a literal)
# ---------------------------------------------------------------------------

def scan(s, start=0, end=None):
    """Yields (kind, a, b) spans over s[start:end]: kind is 'code', 'comment',
    'string' (a '...' literal, quotes included), 'ident' ("..."), or 'dollar'
    (a dollar-quoted body, delimiters included)."""
    end = len(s) if end is None else end
    i = start
    code_a = i
    while i < end:
        c = s[i]
        if c == '-' and s.startswith('--', i):
            j = s.find('\n', i)
            j = end if j < 0 or j > end else j
            kind = 'comment'
        elif c == '/' and s.startswith('/*', i):
            j = s.find('*/', i)
            j = end if j < 0 else j + 2
            kind = 'comment'
        elif c == "'":
            j = i + 1
            while j < end:
                if s[j] == "'":
                    if j + 1 < end and s[j + 1] == "'":
                        j += 2
                        continue
                    break
                j += 1
            j += 1
            kind = 'string'
        elif c == '"':
            j = s.find('"', i + 1) + 1
            kind = 'ident'
        elif c == '$':
            m = re.compile(r'\$([A-Za-z_][A-Za-z0-9_]*)?\$').match(s, i)
            if m and (i == 0 or not (s[i - 1].isalnum() or s[i - 1] == '_')):
                tag = m.group(0)
                j = s.find(tag, m.end())
                j = end if j < 0 else j + len(tag)
                kind = 'dollar'
            else:
                i += 1
                continue
        else:
            i += 1
            continue
        if code_a < i:
            yield ('code', code_a, i)
        yield (kind, i, j)
        i = j
        code_a = i
    if code_a < end:
        yield ('code', code_a, end)


def statements(s):
    """Top-level statements of a script: (a, b) spans, b just past the ';'."""
    out = []
    a = 0
    depth = 0
    for kind, x, y in scan(s):
        if kind != 'code':
            continue
        for k in range(x, y):
            ch = s[k]
            if ch == '(':
                depth += 1
            elif ch == ')':
                depth -= 1
            elif ch == ';' and depth == 0:
                out.append((a, k + 1))
                a = k + 1
    return out


def strip_lead(s, a, b):
    """Moves a past leading whitespace, comments and psql meta lines."""
    while a < b:
        m = re.compile(r'\s+').match(s, a)
        if m and m.end() > a:
            a = m.end()
            continue
        if s.startswith('--', a) or s.startswith('\\', a):
            j = s.find('\n', a)
            a = b if j < 0 else j + 1
            continue
        break
    return a


# ---------------------------------------------------------------------------
# Mutation sites
# ---------------------------------------------------------------------------

class Site:
    def __init__(self, script, a, b, new, op, what, unit):
        self.script, self.a, self.b, self.new, self.op, self.what, self.unit = \
            script, a, b, new, op, what, unit


def code_matches(s, pattern, a, b, flags=0):
    """Regex matches inside [a, b) that start in code (not comments/literals)."""
    rx = re.compile(pattern, flags)
    for kind, x, y in scan(s, a, b):
        if kind == 'code':
            for m in rx.finditer(s, x, y):
                yield m
        elif kind == 'dollar':
            # a function body: scan inside it (the delimiters excluded)
            tag = re.compile(r'\$[A-Za-z0-9_]*\$').match(s, x).group(0)
            for m in code_matches(s, pattern, x + len(tag), y - len(tag), flags):
                yield m


def string_literals(s, a, b):
    for kind, x, y in scan(s, a, b):
        if kind == 'string':
            yield x, y
        elif kind == 'dollar':
            tag = re.compile(r'\$[A-Za-z0-9_]*\$').match(s, x).group(0)
            for r in string_literals(s, x + len(tag), y - len(tag)):
                yield r


CMP = {'<': ['<='], '<=': ['<'], '>': ['>='], '>=': ['>'], '=': ['<>'], '<>': ['='], '!=': ['=']}
STR = {
    "'local'": ["'off'"], "'off'": ["'on'"], "'on'": ["'off'"],
    "'acquired'": ["'released'"], "'released'": ["'acquired'"], "'force_released'": ["'released'"],
    "'ok'": ["'lapsed'"], "'lapsed'": ["'not_owner'"], "'not_owner'": ["'lapsed'"],
    "'epoch_mismatch'": ["'lapsed'"], "'pg_lease'": ["'pg_lease_mutant'"],
    "'read committed'": ["'serializable'"], "'22023'": ["'22000'"], "'57014'": ["'55000'"],
    "'55000'": ["'22023'"], "'25000'": ["'22023'"], "'synchronous_commit'": ["'work_mem'"],
    "'event'": ["'evt'"], "'key'": ["'k'"], "'owner'": ["'own'"], "'epoch'": ["'ep'"],
    "'MEMBER'": ["'USAGE'"],
}
LOCKS = [
    (r'\bFOR\s+NO\s+KEY\s+UPDATE\b(?!\s+(NOWAIT|SKIP))',
     ['FOR UPDATE', 'FOR SHARE', 'FOR KEY SHARE', 'FOR NO KEY UPDATE NOWAIT', '']),
    (r'\bFOR\s+UPDATE\s+SKIP\s+LOCKED\b', ['FOR UPDATE', 'FOR UPDATE NOWAIT', 'FOR SHARE SKIP LOCKED', '']),
    (r'(?<!KEY )\bFOR\s+UPDATE\b(?!\s+(NOWAIT|SKIP))',
     ['FOR NO KEY UPDATE', 'FOR SHARE', 'FOR UPDATE NOWAIT', '']),
    (r'(?<!KEY )\bFOR\s+SHARE\b(?!\s+(NOWAIT|SKIP))', ['FOR KEY SHARE', 'FOR UPDATE', 'FOR SHARE NOWAIT', '']),
    (r'\bFOR\s+KEY\s+SHARE\b(?!\s+(NOWAIT|SKIP))', ['FOR SHARE', '']),
]
STMT_START = re.compile(
    r'(PERFORM|RAISE|UPDATE|INSERT|DELETE|CONTINUE|RETURN|EXIT|EXECUTE|SELECT|WITH|[a-z_][a-z0-9_]*\s*:=)',
    re.I)


def body_span(s, a, b):
    """The dollar-quoted body of the CREATE FUNCTION / DO statement s[a:b]."""
    for kind, x, y in scan(s, a, b):
        if kind == 'dollar':
            tag = re.compile(r'\$[A-Za-z0-9_]*\$').match(s, x).group(0)
            return x + len(tag), y - len(tag)
    return None


def plpgsql_statements(s, a, b):
    """Spans of simple PL/pgSQL statements in body [a, b) (those that can be
    replaced by NULL; without breaking the block structure)."""
    out = []
    depth = 0
    line_start = True
    stmt_a = None
    for kind, x, y in scan(s, a, b):
        if kind != 'code':
            if kind == 'comment' and s.startswith('--', x):
                line_start = True
            elif stmt_a is None:
                line_start = False
            continue
        k = x
        while k < y:
            ch = s[k]
            if stmt_a is None:
                if ch == '\n':
                    line_start = True
                elif ch in ' \t':
                    pass
                elif line_start:
                    m = STMT_START.match(s, k)
                    line_start = False
                    if m and m.end() <= y:
                        word = m.group(1).upper()
                        prev = s[a:k].rstrip()
                        # a SELECT/WITH that is not a statement of its own (inside a
                        # RETURN QUERY or an UPDATE's continuation) is skipped by the
                        # line-start rule: only lines that begin a statement count
                        if not prev.endswith((';', 'THEN', 'ELSE', 'LOOP', 'BEGIN', 'DECLARE')) and \
                                not re.search(r'(;|THEN|ELSE|LOOP|BEGIN)\s*(--[^\n]*)?$', prev):
                            k += 1
                            continue
                        if word in ('RETURN',) and re.match(r'RETURN\s+QUERY', s[k:k + 20], re.I):
                            pass
                        stmt_a = k
                        depth = 0
                else:
                    pass
            else:
                if ch == '(':
                    depth += 1
                elif ch == ')':
                    depth -= 1
                elif ch == ';' and depth == 0:
                    out.append((stmt_a, k + 1))
                    stmt_a = None
                    line_start = False
            k += 1
    return out


def unit_sha(texts, st):
    """sha1 of the mutated unit's text: the function definition (or DO
    block, ACL statement) around the site, after the change."""
    s = texts[st.script]
    a, b = st.unit_span
    return hashlib.sha1((st.script + '\0' + s[a:st.a] + st.new + s[st.b:b]).encode()).hexdigest()[:16]


def chain_sha(texts, order, control):
    """sha1 of the unmutated install chain (every script in install order and
    the control file): a mutant's result holds only for the SQL it ran
    beside. A change anywhere in the chain (a released script's statement is
    undone or made moot by a later one: 0.3.0's privilege reset supersedes
    every GRANT and REVOKE of 0.1.0) can change a verdict, so --resume keeps
    results of the same chain only."""
    h = hashlib.sha1(control.encode())
    for n in order:
        h.update(('\0' + n + '\0' + texts[n]).encode())
    return h.hexdigest()[:16]


def units(path_texts, final_scripts):
    """(script, a, b, kind, name) of every mutable unit: final function
    definitions, DO blocks, and top-level ACL/ownership statements."""
    out = []
    defs = {}   # function name -> (script, a, b)
    for script in final_scripts:
        s = path_texts[script]
        for a, b in statements(s):
            a = strip_lead(s, a, b)
            head = s[a:b]
            m = re.match(r'CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+lease\.(\w+)\s*\(', head, re.I)
            if m:
                defs[m.group(2)] = (script, a, b)
                continue
            m = re.match(r'DROP\s+FUNCTION\s+(IF\s+EXISTS\s+)?lease\.(\w+)', head, re.I)
            if m:
                defs.pop(m.group(2), None)
                continue
            if re.match(r'DO\s', head, re.I):
                out.append((script, a, b, 'do', 'DO@%s' % short(script)))
                continue
            if re.match(r'(REVOKE|GRANT|ALTER\s+\w+(\s+\w+)?\s+.*\sOWNER\s+TO)\b', head, re.I | re.S):
                out.append((script, a, b, 'acl', 'acl@%s' % short(script)))
    for name, (script, a, b) in defs.items():
        out.append((script, a, b, 'function', name))
    out.sort(key=lambda u: (final_scripts.index(u[0]), u[1]))
    return out


def short(script):
    n = script[len('pg_lease--'):-len('.sql')]
    return n.replace('--', '-')


def sites(texts, unit_list, ops):
    out = []
    for script, a, b, kind, name in unit_list:
        s = texts[script]
        def add(x, y, new, op, what, script=script, a=a, b=b, name=name):
            st = Site(script, x, y, new, op, what, name)
            st.unit_span = (a, b)
            out.append(st)
        if kind == 'acl':
            if 'acl' in ops:
                st = s[a:b]
                add(a, b, '', 'acl', 'removed: ' + ' '.join(st.split())[:90])
                m = re.match(r'REVOKE\s+(.*?)\s+FROM\s+PUBLIC\s*;', st, re.I | re.S)
                if m:
                    add(a, b, 'GRANT %s TO PUBLIC;' % m.group(1), 'acl',
                        'REVOKE -> GRANT: ' + ' '.join(st.split())[:80])
            continue
        body = body_span(s, a, b)
        if body is None:
            continue
        ba, bb = body
        header = (a, ba)
        lang_plpgsql = kind == 'do' or re.search(r'LANGUAGE\s+plpgsql', s[a:b], re.I)
        if 'attr' in ops and kind == 'function':
            for m in code_matches(s, r'\bSECURITY\s+DEFINER\b', a, b, re.I):
                add(m.start(), m.end(), 'SECURITY INVOKER', 'attr', 'SECURITY DEFINER -> INVOKER')
            for m in code_matches(s, r'\bSET\s+search_path\s*=\s*pg_catalog\s*,\s*pg_temp\b', *header):
                add(m.start(), m.end(), '', 'attr', 'SET search_path removed')
        if 'cmp' in ops:
            for m in code_matches(s, r'(?<![<>=!:|])(<=|>=|<>|!=|=|<|>)(?![=>])', ba, bb):
                before = s[max(ba, m.start() - 40):m.start()]
                if m.group(1) == '=' and re.search(r'(\bSET|,|\bUSING|\bERRCODE|\bDETAIL|\bHINT|\bMESSAGE)\s*(\w+\s*)?$',
                                                   before, re.I):
                    continue  # an assignment (UPDATE SET, RAISE USING), not a comparison
                for new in CMP[m.group(1)]:
                    add(m.start(), m.end(), new, 'cmp', '%s -> %s' % (m.group(1), new))
        if 'logic' in ops:
            for m in code_matches(s, r'\b(AND|OR)\b(?!\s+REPLACE)', ba, bb):
                new = 'OR' if m.group(1) == 'AND' else 'AND'
                add(m.start(), m.end(), new, 'logic', '%s -> %s' % (m.group(1), new))
        if 'not' in ops:
            for m in code_matches(s, r'\bIS\s+NOT\s+NULL\b', ba, bb):
                add(m.start(), m.end(), 'IS NULL', 'not', 'IS NOT NULL -> IS NULL')
            for m in code_matches(s, r'\bIS\s+NULL\b', ba, bb):
                add(m.start(), m.end(), 'IS NOT NULL', 'not', 'IS NULL -> IS NOT NULL')
            for m in code_matches(s, r'(?<!IS )\bNOT\s+(?!NULL\b)', ba, bb):
                add(m.start(), m.end(), '', 'not', 'NOT removed')
        if 'int' in ops:
            for m in code_matches(s, r'(?<![\w.$])(\d+)(?![\w.])', ba, bb):
                n = int(m.group(1))
                for new in ([n - 1] if n > 0 else []) + [n + 1]:
                    add(m.start(), m.end(), str(new), 'int', '%d -> %d' % (n, new))
        if 'bool' in ops:
            for m in code_matches(s, r'\b(true|false)\b', ba, bb, re.I):
                new = 'false' if m.group(1).lower() == 'true' else 'true'
                add(m.start(), m.end(), new, 'bool', '%s -> %s' % (m.group(1), new))
        if 'lock' in ops:
            taken = set()
            for pat, news in LOCKS:
                for m in code_matches(s, pat, ba, bb, re.I):
                    if m.start() in taken:
                        continue
                    taken.add(m.start())
                    for new in news:
                        add(m.start(), m.end(), new, 'lock',
                            '%s -> %s' % (' '.join(m.group(0).split()), new or '(no locking clause)'))
        if 'clock' in ops:
            for m in code_matches(s, r'\bclock_timestamp\(\)', ba, bb):
                for new in ('now()', 'statement_timestamp()'):
                    add(m.start(), m.end(), new, 'clock', 'clock_timestamp() -> ' + new)
        if 'minmax' in ops:
            for m in code_matches(s, r'\b(least|greatest)\(', ba, bb, re.I):
                new = 'greatest(' if m.group(1).lower() == 'least' else 'least('
                add(m.start(), m.end(), new, 'minmax', '%s( -> %s' % (m.group(1), new))
        if 'str' in ops:
            for x, y in string_literals(s, ba, bb):
                lit = s[x:y]
                for new in STR.get(lit, []):
                    add(x, y, new, 'str', '%s -> %s' % (lit, new))
        if 'inlist' in ops:
            for m in code_matches(s, r'\bIN\s*\(', ba, bb, re.I):
                close = s.find(')', m.end())
                inner = s[m.end():close]
                items = [p.strip() for p in inner.split(',')]
                if len(items) < 2 or not all(re.fullmatch(r"'[^']*'", p) for p in items):
                    continue
                for i, it in enumerate(items):
                    rest = ', '.join(items[:i] + items[i + 1:])
                    add(m.end(), close, rest, 'inlist', 'IN list without %s' % it)
        if 'stmt' in ops and lang_plpgsql:
            for x, y in plpgsql_statements(s, ba, bb):
                st = ' '.join(s[x:y].split())
                if re.match(r'NULL\s*;', st):
                    continue
                add(x, y, 'NULL;', 'stmt', 'removed: ' + st[:90])
    return out


def assign_ids(site_list, texts):
    """Stable ids: <unit>.<op>.<n>, n counting that unit's sites of that op in
    text order (so an id names the same change while the text around it is the
    same)."""
    counts = {}
    ids = []
    for st in site_list:
        k = (st.unit, st.op)
        counts[k] = counts.get(k, 0) + 1
        ids.append('%s.%s.%d' % (st.unit, st.op, counts[k]))
    return ids


def line_of(s, a):
    return s.count('\n', 0, a) + 1


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

def sh(cmd, log, env=None, timeout=None, cwd=None):
    """Runs cmd in a process group of its own; on timeout the whole group is
    killed (make's children, pg_regress and its psql, would go on otherwise)."""
    with open(log, 'w') as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            f.write('\nmutate: TIMEOUT after %ss\n' % timeout)
            return 124


def failing_tests(log):
    try:
        t = open(log, errors='replace').read()
    except OSError:
        return []
    names = set(re.findall(r'^(?:test |not ok \d+\s+-\s+)?\s*([A-Za-z0-9_]+)\s+\.\.\.\s+FAILED', t, re.M))
    names |= set(re.findall(r'^not ok \d+\s+-\s+([A-Za-z0-9_]+)', t, re.M))
    names |= set(re.findall(r'^\s*--- FAIL: ([A-Za-z0-9_/]+)', t, re.M))
    # installcheck's dump/restore check (sql/test/dump/dump_restore.sh)
    if re.search(r'installcheck-dump\] Error', t):
        names.add('dump_restore')
    return sorted(names)


# The upgrade check's isolation database (hack/test-matrix.sh, run_upgrade b):
# created at 0.1.0, given leases, updated to 0.2.0, given more, updated.
UPGRADE_ISO_SETUP = """
CREATE EXTENSION pg_lease VERSION '0.1.0';
SELECT acquired FROM lease.acquire('iu-held', 'o1', interval '1h');
SELECT acquired FROM lease.acquire('iu-free', 'o1', interval '1h');
SELECT status FROM lease.release('iu-free', 'o1', 1);
SELECT acquired FROM lease.acquire('iu-held2', 'o2', interval '1h');
SELECT acquired FROM lease.acquire('iu-lapsed2', 'o2', interval '1ms');
ALTER EXTENSION pg_lease UPDATE;
"""


def upgrade_suite(plan, work, log, env, out, mid):
    """The upgrade check as hack/test-matrix.sh runs it (run_upgrade): a. one
    pg_regress run of sql/test/upgrade's scripts, the regression suite in the
    same database and the catalog comparison; b. the isolation suite on a
    database whose extension was created at 0.1.0 and updated. Returns the
    first non-zero exit status (a's log is LOG, b's LOG with .iso)."""
    pgxs = os.path.join(subprocess.check_output([plan['pg_config'], '--pkglibdir'], text=True).strip(),
                        'pgxs', 'src', 'test')
    inp = os.path.join(work, 'upgrade-input')
    if not os.path.isdir(inp):
        for sub, pats in (('sql', ('test/sql/*.sql', 'test/upgrade/sql/*.sql')),
                          ('expected', ('test/expected/*.out', 'test/upgrade/expected/*.out'))):
            os.makedirs(os.path.join(inp, sub))
            for pat in pats:
                for f in glob.glob(os.path.join(work, pat)):
                    os.symlink(f, os.path.join(inp, sub, os.path.basename(f)))
    regress = sorted(os.path.basename(f)[:-4] for f in glob.glob(os.path.join(work, 'test', 'sql', '*.sql')))
    ups = sorted(os.path.basename(f)[:-4] for f in glob.glob(os.path.join(work, 'test', 'upgrade', 'sql', 'upgrade_*.sql')))
    last = [u for u in ups if re.match(r'upgrade_9[0-9]_', u)]
    ups = [u for u in ups if u not in last]
    odir = os.path.join(work, 'upgrade-out')
    shutil.rmtree(odir, ignore_errors=True)
    rc = sh([os.path.join(pgxs, 'regress', 'pg_regress'), '--inputdir=' + inp, '--outputdir=' + odir,
             '--bindir=' + plan['bindir'], '--dbname=contrib_regression'] + ups + regress + last,
            log, env=env, timeout=SUITE_TIMEOUT, cwd=work)
    if os.path.exists(os.path.join(odir, 'regression.diffs')):
        shutil.copy(os.path.join(odir, 'regression.diffs'), os.path.join(out, '%s.upgrade.diffs' % mid))
    if rc != 0:
        return rc
    psql = [os.path.join(plan['bindir'], 'psql'), '-X', '-q', '-v', 'ON_ERROR_STOP=1']
    setup = psql + ['-d', 'postgres', '-c', 'DROP DATABASE IF EXISTS isolation_upgrade',
                    '-c', 'CREATE DATABASE isolation_upgrade TEMPLATE=template0']
    for k, v in (('lc_messages', "'C'"), ('lc_monetary', "'C'"), ('lc_numeric', "'C'"), ('lc_time', "'C'"),
                 ('bytea_output', "'hex'"), ('timezone_abbreviations', "'Default'")):
        setup += ['-c', 'ALTER DATABASE isolation_upgrade SET %s TO %s' % (k, v)]
    setup += ['-c', '\\c isolation_upgrade', '-c', UPGRADE_ISO_SETUP]
    rc = sh(setup, log + '.setup', env=env, timeout=60, cwd=work)
    if rc != 0:
        with open(log, 'a') as f:
            f.write('\nmutate: the upgraded isolation database could not be made (see %s.setup)\n' % log)
        return rc
    specs = sorted(os.path.basename(f)[:-5] for f in glob.glob(os.path.join(work, 'test', 'specs', '*.spec')))
    iodir = os.path.join(work, 'upgrade-isolation-out')
    shutil.rmtree(iodir, ignore_errors=True)
    rc = sh([os.path.join(pgxs, 'isolation', 'pg_isolation_regress'), '--inputdir=test', '--outputdir=' + iodir,
             '--bindir=' + plan['bindir'], '--use-existing', '--dbname=isolation_upgrade'] + specs,
            log + '.iso', env=env, timeout=SUITE_TIMEOUT, cwd=work)
    if os.path.exists(os.path.join(iodir, 'regression.diffs')):
        shutil.copy(os.path.join(iodir, 'regression.diffs'), os.path.join(out, '%s.upgrade-isolation.diffs' % mid))
    with open(log, 'a') as f:  # one log for failing_tests
        f.write(open(log + '.iso', errors='replace').read())
    return rc


def inner(args):
    """Runs inside hack/with-postgres.sh: the plan's mutants through the suites."""
    plan = json.load(open(args.plan))
    out, extdir, work = plan['out'], plan['extdir'], plan['work']
    suites = plan['suites']
    env = dict(os.environ)
    env['PGISOLATIONTIMEOUT'] = '60'
    # a mutant that loops forever is ended by the server (the suites' own
    # SETs still win; no statement of theirs runs for 15 s), never hangs the
    # run; a suite that still runs past SUITE_TIMEOUT counts as caught
    env["PGOPTIONS"] = "-c statement_timeout=10s"
    reset_sql = os.path.join(work, 'reset.sql')
    with open(reset_sql, 'w') as f:
        f.write("SELECT format('DROP DATABASE IF EXISTS %I', datname) FROM pg_database\n"
                "  WHERE datname NOT IN ('postgres', 'template0', 'template1') \\gexec\n"
                "SELECT format('DROP OWNED BY %I CASCADE; DROP ROLE %I', rolname, rolname) FROM pg_roles\n"
                "  WHERE rolname !~ '^pg_' AND rolname <> current_user \\gexec\n")
    results = []
    t_all = time.time()
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
    for i, m in enumerate(plan['mutants']):
        mid = m['id']
        t0 = time.time()
        for f in glob.glob(os.path.join(work, 'pg_lease--*.sql')):
            os.remove(f)
        for name, text in plan['control_files'].items():
            open(os.path.join(extdir, name), 'w').write(text)
        for name, text in m['files'].items():
            open(os.path.join(extdir, name), 'w').write(text)
            open(os.path.join(work, name), 'w').write(text)
        psql = [os.path.join(plan['bindir'], 'psql'), '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'postgres']
        # a clean cluster: nothing left by the previous mutant's timeouts
        # (a killed suite's backends finish their statement first)
        sh(psql + ['-c', '''DO $$
BEGIN
  FOR i IN 1..150 LOOP
    PERFORM pg_stat_clear_snapshot();  -- else the view repeats this transaction's first reading
    PERFORM pg_terminate_backend(pid) FROM pg_stat_activity
      WHERE pid <> pg_backend_pid() AND backend_type = 'client backend';
    EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity
      WHERE pid <> pg_backend_pid() AND backend_type = 'client backend');
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$'''], os.path.join(out, '%s.reset.log' % mid), env=env, timeout=60)
        # and nothing left by a suite killed half-way (a TIMEOUT): its
        # databases and roles would fail the next mutant's suites ("role ...
        # already exists"), a catch that is not the mutant's
        sh(psql + ['-f', reset_sql], os.path.join(out, '%s.reset2.log' % mid), env=env, timeout=60)
        probe = psql + ['-c', 'DROP DATABASE IF EXISTS mutate_probe', '-c', 'CREATE DATABASE mutate_probe',
                        '-c', '\\c mutate_probe', '-c', 'CREATE EXTENSION pg_lease',
                        '-c', 'DROP EXTENSION pg_lease', '-c', "CREATE EXTENSION pg_lease VERSION '%s'" % plan['base'],
                        '-c', 'ALTER EXTENSION pg_lease UPDATE',
                        '-c', '\\c postgres', '-c', 'DROP DATABASE mutate_probe']
        r = {'id': mid, 'op': m['op'], 'what': m['what'], 'script': m['script'], 'line': m['line'],
             'unit': m['unit'], 'unit_sha': m.get('unit_sha', ''), 'chain_sha': plan.get('chain_sha', ''),
             'suites': {}}
        if sh(probe, os.path.join(out, '%s.probe.log' % mid), env=env, timeout=120) != 0:
            r['verdict'] = 'stillborn'
        else:
            r['verdict'] = 'survived'
            for s in suites:
                ts = time.time()
                log = os.path.join(out, '%s.%s.log' % (mid, s))
                if s == 'regression':
                    rc = sh(['make', '-s', 'installcheck', 'ISOLATION=', 'PG_CONFIG=' + plan['pg_config']],
                            log, env=env, timeout=SUITE_TIMEOUT, cwd=work)
                    for d in ('regression.diffs',):
                        if os.path.exists(os.path.join(work, d)):
                            shutil.copy(os.path.join(work, d), os.path.join(out, '%s.%s.diffs' % (mid, s)))
                elif s == 'isolation':
                    rc = sh(['make', '-s', 'installcheck', 'REGRESS=', 'PG_CONFIG=' + plan['pg_config']],
                            log, env=env, timeout=SUITE_TIMEOUT, cwd=work)
                    d = os.path.join(work, 'output_iso', 'regression.diffs')
                    if os.path.exists(d):
                        shutil.copy(d, os.path.join(out, '%s.%s.diffs' % (mid, s)))
                elif s == 'upgrade':
                    rc = upgrade_suite(plan, work, log, env, out, mid)
                else:
                    genv = dict(env)
                    genv.pop('PGOPTIONS', None)
                    genv['PGLEASE_FUZZ_SQL'] = os.path.join(out, '%s.plain.sql' % mid)
                    rc = sh(['go', 'test', '-count=1', '-timeout', '10m', plan['go_pkg']], log,
                            env=genv, timeout=SUITE_TIMEOUT, cwd=REPO)
                tests = failing_tests(log)
                if rc == 124:
                    tests = ['TIMEOUT(%ds)' % SUITE_TIMEOUT] + tests
                r['suites'][s] = {'rc': rc, 'failed': tests, 'secs': round(time.time() - ts, 1)}
                if rc != 0:
                    r['verdict'] = 'caught' if tests else 'error'
                    if m['id'] == 'control':
                        r['verdict'] = 'FAIL'
                    break
            if m['id'] == 'control' and r['verdict'] == 'survived':
                r['verdict'] = 'pass'
        r['secs'] = round(time.time() - t0, 1)
        results.append(r)
        if mid == 'control':
            results += plan.get('prev', [])
        sdesc = ' '.join('%s=%s%s' % (k, 'fail' if v['rc'] else 'pass',
                                      '(%s)' % ','.join(v['failed'][:4]) if v['failed'] else '')
                         for k, v in r['suites'].items())
        print('[%d/%d] %-9s %-34s %5.0fs  %s  %s' % (i + 1, len(plan['mutants']), r['verdict'], mid, r['secs'],
                                                      m['what'][:60], sdesc), flush=True)
        json.dump({'results': results, 'secs': round(time.time() - t_all), 'started': started,
                   'planned': len(plan['mutants']) - 1 + len(plan.get('prev', [])), 'seed': plan.get('seed'), 'max': plan.get('max')},
                  open(os.path.join(out, 'results.partial.json'), 'w'), indent=1)
        if mid == 'control' and r['verdict'] != 'pass':
            print('mutate: the control (unmodified SQL) did not pass: see %s/control.*.log' % out, flush=True)
            break
    json.dump({'results': results, 'secs': round(time.time() - t_all), 'started': started,
               'planned': len(plan['mutants']) - 1 + len(plan.get('prev', [])), 'seed': plan.get('seed'), 'max': plan.get('max')},
              open(os.path.join(out, 'results.inner.json'), 'w'), indent=1)


def merge(dirs, out):
    """Joins the results.partial.json and logs of shard runs into out."""
    results, secs, started = {}, 0, None
    control = None
    os.makedirs(out, exist_ok=True)
    for d in dirs:
        try:
            part = json.load(open(os.path.join(d, 'results.partial.json')))
        except (OSError, ValueError) as e:
            die('--merge: no results in %s: %s' % (d, e))
        for r in part['results']:
            if r['id'] == 'control':
                if control is None or r['verdict'] != 'pass':
                    control = r
            else:
                results[r['id']] = r  # a result of a later shard replaces an earlier one
        secs += part.get('secs', 0)
        started = min(started or part.get('started', '?'), part.get('started', '?'))
        if os.path.realpath(d) != os.path.realpath(out):
            for f in glob.glob(os.path.join(d, '*')):
                if not f.endswith('.json') and os.path.isfile(f):
                    shutil.copy(f, out)
    if control is None:
        die('--merge: no shard has a control result')
    json.dump({'results': [control] + list(results.values()), 'secs': secs, 'started': started,
               'planned': len(results), 'seed': None, 'max': None},
              open(os.path.join(out, 'results.partial.json'), 'w'), indent=1)
    print('mutate: --merge: %d results from %s into %s' % (len(results), ', '.join(dirs), out))


def load_equivalent():
    """{id: (unit_sha, reason)} of hack/mutate-equivalent.txt. Each line is
    ID UNIT_SHA REASON: the unit_sha (hack/mutate.py --list --sha) pins the
    mutated function's text, so an entry whose id now names another site, or
    whose function changed since it was checked, no longer applies."""
    eq = {}
    if os.path.exists(EQUIV_FILE):
        for line in open(EQUIV_FILE):
            line = line.strip()
            if line and not line.startswith('#'):
                mid, _, rest = line.partition(' ')
                sha, _, why = rest.strip().partition(' ')
                if not re.fullmatch(r'[0-9a-f]{16}', sha):
                    die('%s: %s: no unit_sha after the id (see hack/mutate.py --list --sha)' % (EQUIV_FILE, mid))
                eq[mid] = (sha, why.strip())
    return eq


SHARED = re.compile(r'^-- @shared-begin.*?^-- @shared-end[^\n]*\n', re.M | re.S)


def shared_copies(orig, mutated, version, allfiles):
    """The direct update scripts to version with the mutant of the full
    script's shared part made in them too: {name: text}. Empty when the
    mutant lies outside the shared part (in the fresh install's state)."""
    a, b = SHARED.search(orig), SHARED.search(mutated)
    if not a or not b or a.group(0) == b.group(0):
        return {}
    out = {}
    for n, t in allfiles.items():
        if n.endswith('--%s.sql' % version) and n.count('--') == 2:
            if t.count(a.group(0)) != 1:
                die('%s does not carry the shared part of pg_lease--%s.sql: run go run ./hack/gensql' % (n, version))
            out[n] = t.replace(a.group(0), b.group(0))
    return out


def plain_sql(files, order):
    out = []
    for n in order:
        t = files[n]
        out.append(t if t.endswith('\n') else t + '\n')
    return ''.join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--list', action='store_true', help='print the candidate mutants and exit')
    ap.add_argument('--sha', action='store_true', help='with --list: print each mutant\'s unit_sha too')
    ap.add_argument('--max', type=int, default=0, help='sample this many mutants (0: all)')
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--only', default='', help='comma-separated mutant ids')
    ap.add_argument('--units', default='',
                    help='comma-separated units (function names, DO@..., acl@...): only their mutants')
    ap.add_argument('--skip-units', default='',
                    help='comma-separated units whose mutants are left out (functions being rewritten)')
    ap.add_argument('--ops', default=','.join(ALL_OPS))
    ap.add_argument('--suites', default='regression,isolation,go,upgrade')
    ap.add_argument('--out', default=os.environ.get('MUTATE_OUT', '/tmp/pg_lease-mutate'))
    ap.add_argument('--bindir', default=os.environ.get('PGLEASE_PG_BINDIR', ''))
    ap.add_argument('--go-pkg', default='./test/fuzz')
    ap.add_argument('--shuffle', action='store_true',
                    help='run the selection in an order drawn with --seed (a run stopped early is then a sample)')
    ap.add_argument('--resume', default='',
                    help='results.partial.json of an earlier run: its mutants are not run again, their results kept')
    ap.add_argument('--rerun-survivors', action='store_true',
                    help='with --resume: run the earlier survivors again (after new tests were written)')
    ap.add_argument('--shard', default='',
                    help='K/N: run only every N-th mutant of the selection, from the K-th (1-based); '
                         'N runs side by side (each its own copy and cluster) share a pass; see --merge')
    ap.add_argument('--merge', default='',
                    help='comma-separated --out directories of shards: their results and logs are joined into '
                         '--out, and its table is printed (no run)')
    ap.add_argument('--report-only', action='store_true',
                    help='no run: the table of the (possibly unfinished) run in --out (results.partial.json)')
    ap.add_argument('--inner', action='store_true', help=argparse.SUPPRESS)
    ap.add_argument('--plan', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(args)

    ops = [o for o in args.ops.split(',') if o]
    for o in ops:
        if o not in ALL_OPS:
            die('unknown operator %s (known: %s)' % (o, ' '.join(ALL_OPS)))
    suites = [s for s in args.suites.split(',') if s]
    for s in suites:
        if s not in ALL_SUITES:
            die('unknown suite %s (known: %s)' % (s, ' '.join(ALL_SUITES)))

    version, order = chain(SQLDIR)
    texts = {n: open(os.path.join(SQLDIR, n)).read() for n in order}
    control = {'pg_lease.control': open(os.path.join(SQLDIR, 'pg_lease.control')).read()}
    csha = chain_sha(texts, order, control['pg_lease.control'])
    unit_list = units(texts, order)
    site_list = sites(texts, unit_list, ops)
    ids = assign_ids(site_list, texts)
    mutants = []
    for mid, st in zip(ids, site_list):
        mutants.append({'id': mid, 'site': st})

    print('mutate: install chain for %s: %s' % (version, ' '.join(order)))
    byop = {}
    for m in mutants:
        byop[m['site'].op] = byop.get(m['site'].op, 0) + 1
    print('mutate: %d candidate mutants in %d units (%s)' % (
        len(mutants), len(unit_list), ', '.join('%s %d' % (o, byop.get(o, 0)) for o in ops)))

    if args.list:
        for m in mutants:
            st = m['site']
            if args.units and st.unit not in args.units.split(','):
                continue
            print('%-36s %-22s %4d  %s%s' % (m['id'], short(st.script), line_of(texts[st.script], st.a),
                                             (unit_sha(texts, st) + '  ') if args.sha else '', st.what))
        return 0

    if args.merge:
        merge(args.merge.split(','), args.out)
        args.report_only = True
    if args.report_only:
        try:
            part = json.load(open(os.path.join(args.out, 'results.partial.json')))
        except (OSError, ValueError) as e:
            die('no results in %s: %s' % (args.out, e))
        pgconfig = os.path.join(args.bindir, 'pg_config') if args.bindir else 'pg_config'
        done = len(part['results']) - 1
        return report(args, ops, suites, version, order, mutants, part['results'], part.get('started', '?'),
                      time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(os.path.getmtime(
                          os.path.join(args.out, 'results.partial.json')))),
                      part['secs'], pgconfig, part.get('seed'), part.get('max') or 0,
                      unfinished=(done, part.get('planned', done)))

    selected = mutants
    if args.units or args.skip_units:
        known = {m['site'].unit for m in mutants}
        want = [x for x in args.units.split(',') if x]
        skip = [x for x in args.skip_units.split(',') if x]
        for w in want + skip:
            if w not in known:
                die('unknown unit %s (see --list: the part of an id before its operator)' % w)
        # the order of --units is the run's order: a pass stopped early covers whole units
        rank = {w: i for i, w in enumerate(want)}
        selected = sorted((m for m in mutants if (not want or m['site'].unit in rank) and m['site'].unit not in skip),
                          key=lambda m: rank.get(m['site'].unit, 0))
        print('mutate: %d mutants in the selected units' % len(selected))
    if args.only:
        want = [x for x in args.only.split(',') if x]
        known = {m['id'] for m in mutants}
        for w in want:
            if w not in known:
                die('unknown mutant id %s (see --list)' % w)
        selected = [m for m in selected if m['id'] in want]
    elif args.max and args.max < len(selected):
        seed = args.seed if args.seed is not None else int(time.time())
        rng = random.Random(seed)
        # stratified: every operator gets its share (at least one), the rest at random
        groups = {}
        for m in selected:
            groups.setdefault(m['site'].op, []).append(m)
        pick = []
        for o in sorted(groups):
            share = max(1, round(args.max * len(groups[o]) / len(selected)))
            pick += rng.sample(groups[o], min(share, len(groups[o])))
        rng.shuffle(pick)
        pick = pick[:args.max]
        keep = {m['id'] for m in pick}
        print('mutate: sampled %d of %d with --seed %d' % (len(keep), len(selected), seed))
        selected = [m for m in selected if m['id'] in keep]
        args.seed = seed
    prev = []
    if args.resume:
        try:
            prev = [r for r in json.load(open(args.resume))['results']
                    if r['id'] != 'control' and r['verdict'] not in ('error', 'stillborn')]  # those run again
        except (OSError, ValueError, KeyError) as e:
            die('--resume %s: %s' % (args.resume, e))
        again = {r['id'] for r in prev if args.rerun_survivors and r['verdict'] in ('survived', 'equivalent')}
        # An earlier result is kept only for the same mutant of the same SQL:
        # the same id, the same mutated text (unit_sha) and the same
        # unmutated chain around it (chain_sha). Results of other SQL, of
        # runs before chain_sha was recorded, or of a mutant that no longer
        # exists are dropped, whether or not the mutant is selected now.
        cur = {m['id']: m for m in mutants}
        def same(r):
            m = cur.get(r['id'])
            if m is None:
                return False
            return r.get('chain_sha') == csha and r.get('unit_sha') == unit_sha(texts, m['site'])
        stale = {r['id'] for r in prev if not same(r)}
        if stale:
            print('mutate: --resume: %d earlier results are of other text or gone: dropped' % len(stale))
        prev = [r for r in prev if r['id'] not in stale]
        done = {r['id'] for r in prev} - again
        selected = [m for m in selected if m['id'] not in done]
        chosen = {m['id'] for m in selected}
        prev = [r for r in prev if r['id'] not in chosen]  # the rest keep their earlier result
        print('mutate: --resume: %d results kept, %d mutants to run' % (len(prev), len(selected)))
    if args.shard:
        try:
            k, n = (int(x) for x in args.shard.split('/'))
            assert 1 <= k <= n
        except (ValueError, AssertionError):
            die('--shard wants K/N with 1 <= K <= N, not %r' % args.shard)
        selected = selected[k - 1::n]
        print('mutate: --shard %d/%d: %d mutants' % (k, n, len(selected)))
    if args.shuffle:
        if args.seed is None:
            args.seed = int(time.time())
        random.Random(args.seed).shuffle(selected)
        print('mutate: order shuffled with --seed %d' % args.seed)
    print('mutate: selection: ' + ','.join(m['id'] for m in selected), flush=True)

    # --- a private copy of the PostgreSQL installation ---
    bindir = args.bindir
    if not bindir:
        try:
            bindir = subprocess.check_output(['pg_config', '--bindir'], text=True).strip()
        except (OSError, subprocess.CalledProcessError):
            die('no PostgreSQL found: install postgresql-15 and postgresql-server-dev-15 '
                '(or set PGLEASE_PG_BINDIR / --bindir)')
    for tool in ('postgres', 'initdb', 'psql', 'pg_config'):
        if not os.access(os.path.join(bindir, tool), os.X_OK):
            die('%s has no %s: install postgresql-15 and postgresql-server-dev-15 (PGXS, pg_regress, '
                'pg_isolation_regress)' % (bindir, tool))
    pgconfig = os.path.join(bindir, 'pg_config')
    pgroot = os.path.dirname(bindir)
    pgshare = subprocess.check_output([pgconfig, '--sharedir'], text=True).strip()
    pgxs = subprocess.check_output([pgconfig, '--pgxs'], text=True).strip()
    if not os.path.exists(pgxs):
        die('PGXS not found at %s: install postgresql-server-dev-15' % pgxs)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    scratch = tempfile.mkdtemp(prefix='pg_lease-mutate.')
    try:
        # the relocatable layout: <scratch>/lib/postgresql/15 and <scratch>/share/postgresql/15
        major = os.path.basename(pgroot)
        os.makedirs(os.path.join(scratch, 'lib', 'postgresql'))
        os.makedirs(os.path.join(scratch, 'share', 'postgresql'))
        subprocess.check_call(['cp', '-a', pgroot, os.path.join(scratch, 'lib', 'postgresql', major)])
        subprocess.check_call(['cp', '-a', pgshare, os.path.join(scratch, 'share', 'postgresql', major)])
        subprocess.check_call(['chmod', '-R', 'a+rX', scratch])
        os.chmod(scratch, 0o755)
        sbin = os.path.join(scratch, 'lib', 'postgresql', major, 'bin')
        spgconfig = os.path.join(sbin, 'pg_config')
        extdir = os.path.join(subprocess.check_output([spgconfig, '--sharedir'], text=True).strip(), 'extension')
        if not os.path.realpath(extdir).startswith(os.path.realpath(scratch) + os.sep):
            die('the copy\'s extension directory %s is not inside %s' % (extdir, scratch))
        for old in glob.glob(os.path.join(extdir, 'pg_lease*')):
            os.remove(old)
        work = os.path.join(scratch, 'work')
        os.makedirs(work)
        shutil.copy(os.path.join(SQLDIR, 'Makefile'), work)
        shutil.copytree(os.path.join(SQLDIR, 'test'), os.path.join(work, 'test'))
        subprocess.check_call(['chmod', '-R', 'a+rwX', work])

        # every script of sql/ is installed (other versions' paths too), the chain's mutated
        allfiles = {os.path.basename(p): open(p).read() for p in glob.glob(os.path.join(SQLDIR, 'pg_lease--*.sql'))}
        plan_mutants = []
        for m in [{'id': 'control', 'site': None}] + selected:
            files = dict(allfiles)
            st = m['site']
            if st is None:
                what, op, script, line, unit = 'the unmodified SQL', 'control', '', 0, ''
            else:
                s = texts[st.script]
                files[st.script] = s[:st.a] + st.new + s[st.b:]
                for n, t in shared_copies(s, files[st.script], version, allfiles).items():
                    files[n] = t
                what, op, script, line, unit = st.what, st.op, st.script, line_of(s, st.a), st.unit
                patch = ''.join(difflib.unified_diff(
                    s.splitlines(True), files[st.script].splitlines(True),
                    'a/sql/' + st.script, 'b/sql/' + st.script, n=2))
                open(os.path.join(args.out, m['id'] + '.patch'), 'w').write(patch)
            plain = plain_sql(files, order)
            open(os.path.join(args.out, m['id'] + '.plain.sql'), 'w').write(plain)
            plan_mutants.append({'id': m['id'], 'op': op, 'what': what, 'script': script, 'line': line,
                                 'unit': unit, 'files': files,
                                 'unit_sha': unit_sha(texts, st) if st is not None else ''})
        base = min((os.path.basename(p)[len('pg_lease--'):-len('.sql')]
                    for p in glob.glob(os.path.join(SQLDIR, 'pg_lease--*.sql'))
                    if '--' not in os.path.basename(p)[len('pg_lease--'):]), key=vkey)
        plan = {'chain_sha': csha, 'prev': prev, 'seed': args.seed, 'max': args.max, 'out': args.out, 'extdir': extdir, 'work': work, 'bindir': sbin, 'pg_config': spgconfig,
                'suites': suites, 'go_pkg': args.go_pkg, 'control_files': control, 'mutants': plan_mutants,
                'base': base}
        planfile = os.path.join(scratch, 'plan.json')
        json.dump(plan, open(planfile, 'w'))
        subprocess.check_call(['chmod', 'a+rwx', args.out])
        t0 = time.time()
        started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
        rc = subprocess.call([os.path.join(REPO, 'hack', 'with-postgres.sh'), '--bindir', sbin, '--',
                              sys.executable, os.path.abspath(__file__), '--inner', '--plan', planfile])
        ended = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
        secs = round(time.time() - t0)
        try:
            inner_res = json.load(open(os.path.join(args.out, 'results.inner.json')))
        except (OSError, ValueError):
            die('the run produced no results (with-postgres.sh exit %d)' % rc)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    return report(args, ops, suites, version, order, mutants, inner_res['results'], started, ended, secs,
                  pgconfig, args.seed, args.max)


def report(args, ops, suites, version, order, mutants, results, started, ended, secs, pgconfig, seed, nmax,
           unfinished=None):
    eq = load_equivalent()
    for r in results:
        if r['verdict'] == 'survived' and r['id'] in eq:
            sha, why = eq[r['id']]
            if r.get('unit_sha') != sha:
                print('mutate: %s: its entry in hack/mutate-equivalent.txt is stale (the function changed '
                      'since it was checked, unit_sha %s, now %s): counted as a survivor' % (r['id'], sha, r.get('unit_sha')))
                continue
            r['verdict'] = 'equivalent'
            r['why'] = why
    ctl = results[0] if results and results[0]['id'] == 'control' else None
    rest = [r for r in results if r['id'] != 'control']
    count = {}
    for r in rest:
        count[r['verdict']] = count.get(r['verdict'], 0) + 1
    try:
        commit = subprocess.check_output(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'], text=True).strip()
        dirty = subprocess.check_output(['git', '-C', REPO, 'status', '--porcelain', 'sql'], text=True).strip()
        if dirty:
            commit += ' (sql/ modified)'
    except (OSError, subprocess.CalledProcessError):
        commit = '?'
    try:
        pgver = subprocess.check_output([pgconfig, '--version'], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        pgver = 'PostgreSQL ?'
    summary = {
        'started': started, 'ended': ended, 'secs': secs, 'commit': commit, 'version': version,
        'chain': order, 'seed': seed, 'max': nmax, 'candidates': len(mutants), 'unfinished': unfinished,
        'selected': len(rest), 'counts': count, 'suites': suites, 'postgres': pgver,
        'cpus': os.cpu_count(), 'load': open('/proc/loadavg').read().split()[:3],
        'control': ctl and ctl['verdict'], 'results': results,
    }
    json.dump(summary, open(os.path.join(args.out, 'results.json'), 'w'), indent=1)
    lines = []
    lines.append('Run: %s – %s (%d min %d s), commit %s, extension %s (%s), %s, %d CPUs, load %s at the end.' % (
        started, ended, secs // 60, secs % 60, commit, version, ' + '.join(order), pgver, os.cpu_count() or 0,
        ' '.join(summary['load'])))
    lines.append('Candidates %d; selected %d%s; suites %s; control %s.' % (
        len(mutants), len(rest),
        ((' (--max %d --seed %s)' % (nmax, seed)) if nmax and not args.only else '') +
        ((', run stopped after %d of %d' % unfinished) if unfinished and unfinished[0] < unfinished[1] else ''),
        ', '.join(suites), ctl and ctl['verdict']))
    lines.append('')
    lines.append('| verdict | count |')
    lines.append('|---|---|')
    for v in ('caught', 'survived', 'equivalent', 'stillborn', 'error'):
        lines.append('| %s | %d |' % (v, count.get(v, 0)))
    lines.append('')
    lines.append('| operator | selected | caught | survived | equivalent | stillborn | error |')
    lines.append('|---|---|---|---|---|---|---|')
    for o in ops:
        rs = [r for r in rest if r['op'] == o]
        if rs:
            c = lambda v: sum(1 for r in rs if r['verdict'] == v)
            lines.append('| %s | %d | %d | %d | %d | %d | %d |' % (
                o, len(rs), c('caught'), c('survived'), c('equivalent'), c('stillborn'), c('error')))
    lines.append('')
    lines.append('| mutant | script:line | change | verdict | caught by |')
    lines.append('|---|---|---|---|---|')
    for r in rest:
        by = ''
        for s, v in r['suites'].items():
            if v['rc'] != 0:
                by = '%s: %s' % (s, ' '.join(v['failed'][:6]) or '(no test named)')
        if r['verdict'] == 'equivalent':
            by = r.get('why', '')
        lines.append('| `%s` | %s:%d | %s | %s | %s |' % (
            r['id'], short(r['script']), r['line'], r['what'].replace('|', '\\|'), r['verdict'], by.replace('|', '\\|')))
    table = '\n'.join(lines) + '\n'
    open(os.path.join(args.out, 'table.md'), 'w').write(table)
    print()
    print(table)
    surv = [r['id'] for r in rest if r['verdict'] == 'survived']
    if ctl is None or ctl['verdict'] != 'pass':
        print('mutate: FAILED: the control did not pass (logs in %s)' % args.out)
        return 2
    if surv:
        print('mutate: %d survived: %s (logs in %s)' % (len(surv), ','.join(surv), args.out))
        return 1
    print('mutate: OK: no mutant survived (logs in %s)' % args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main() or 0)
