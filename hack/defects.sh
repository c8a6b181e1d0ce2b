#!/usr/bin/env bash
# Deliberate-defect run: applies, one at a time, six
# deliberate defects to pg_lease's SQL and shows that the project's suites
# (regression, isolation, failure, robustness) fail for every one of them.
#
#   hack/defects.sh [DEFECT...]          (default: control and all six; `make defects`)
#
#   control                    the repository's SQL, unmodified, through the same mechanisms
#   1_release_keeps_epoch      release frees the key without incrementing the epoch
#   2_now_not_clock            expiry decisions read now() (transaction start) instead of
#                              clock_timestamp() (acquire, renew, release, fence, inspect, list;
#                              the blocking acquire's wait deadline keeps the clock)
#   3_no_sync_forcing          no synchronous_commit forcing under synchronous_commit = off
#   4_lock_while_waiting       the blocking acquire takes the row lock (FOR UPDATE, outside any
#                              subtransaction) before each sleep and keeps it while it waits
#   5_renew_no_epoch_check     renew checks the row's epoch instead of the caller's
#   6_inspect_lapsed_as_held   inspect reports a lapsed holder as held
#
# Each defect is an exact text substitution in a copy of the repository's
# scripts, in the named function's final definition (the last script on the
# install path that creates it, so that a later update script does not undo
# it); every substitution asserts how often its pattern occurs, so the
# script fails loudly rather than test an unmodified copy. hack/mutate.py
# (`make mutate`) applies hundreds of generated mutants the same way. The broken copy is
# then run through:
#   regression, isolation  PGXS `make installcheck` (each suite on its own) against a throwaway
#                          cluster started from a private copy of the PostgreSQL installation
#                          whose extension directory holds the broken scripts (the approach of
#                          sql/test/prove-breaks.sh; the shared extension dir is never written);
#   failure                go test ./test/failure with PGLEASE_FAILURE_SQL=<broken base+update>;
#   robustness             cmd/pglease-robustness -sql <broken base+update>, fixed seed, bounded.
# A suite "caught" a defect when it failed with at least one failing test (a
# run that failed for another reason, e.g. the script did not install, is
# "error", which is not a catch). The control must pass every suite.
#
# Environment: DEFECTS_OUT (logs, default /tmp/pg_lease-defects),
# DEFECTS_SUITES (default "regression isolation failure robustness"),
# DEFECTS_SEED (robustness seed, default 20260801), DEFECTS_DURATION
# (robustness duration, default 60s).
#
# Exit status: 0 when the control passed every suite run and every defect was
# caught by at least one suite; 1 otherwise; 2 on a usage or setup error.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
sqldir="$repo/sql"
out="${DEFECTS_OUT:-/tmp/pg_lease-defects}"
suites=(${DEFECTS_SUITES:-regression isolation failure robustness})
seed="${DEFECTS_SEED:-20260801}"
duration="${DEFECTS_DURATION:-60s}"
export PATH="$PATH:/usr/local/go/bin"

all=(control 1_release_keeps_epoch 2_now_not_clock 3_no_sync_forcing 4_lock_while_waiting
     5_renew_no_epoch_check 6_inspect_lapsed_as_held)
[ $# -gt 0 ] || set -- "${all[@]}"
for d in "$@"; do
  case " ${all[*]} " in *" $d "*) ;; *) echo "defects.sh: unknown defect $d (known: ${all[*]})" >&2; exit 2 ;; esac
done
for s in "${suites[@]}"; do
  case "$s" in regression|isolation|failure|robustness) ;; *) echo "defects.sh: unknown suite $s" >&2; exit 2 ;; esac
done
rm -rf "$out"
mkdir -p "$out"

# --- a private copy of the PostgreSQL installation ---
. "$(dirname "${BASH_SOURCE[0]}")/lib/private-pg.sh"
private_pg defects "$sqldir"

echo "building the robustness runner"
(cd "$repo" && go build -o "$scratch/pglease-robustness" ./cmd/pglease-robustness)

# --- the defects: exact, asserted substitutions ---
# make_defect DEFECT DIR: writes DIR/pg_lease--*.sql (broken where the
# default version's install runs them) and DIR/plain.sql (for plain
# installs). With a full script of the default version (0.4.0 on), the
# defect goes into it and into the same shared part of the direct update
# scripts; before, into the base script and the update chain.
make_defect() {
  python3 - "$sqldir" "$2" "$1" <<'PY'
import glob, os, re, sys
src, dst, defect = sys.argv[1:4]
version = re.search(r"^default_version = '([^']+)'", open(os.path.join(src, 'pg_lease.control')).read(), re.M).group(1)
allnames = sorted(os.path.basename(p) for p in glob.glob(os.path.join(src, 'pg_lease--*.sql')))
full = 'pg_lease--%s.sql' % version
if full in allnames:
    order = [full]                     # CREATE EXTENSION runs this script alone
else:
    base_name = 'pg_lease--0.1.0.sql'
    updates = sorted((n for n in allnames if n.count('--') == 2),
                     key=lambda n: [int(x) for x in re.findall(r'\d+', n)])
    order = [base_name] + updates      # the scripts, in the order an install runs them
texts = {n: open(os.path.join(src, n)).read() for n in allnames}
orig = dict(texts)
HEAD = r'CREATE (?:OR REPLACE )?FUNCTION lease\.%s\('

def where(name):
    """The script holding lease.<name>'s final definition (the last one on the
    install path that creates it): a defect in an older definition would be
    undone by the update that replaces it."""
    hits = [n for n in order if re.search(HEAD % re.escape(name), texts[n])]
    if not hits:
        sys.exit('defect %s: no script defines lease.%s' % (defect, name))
    return hits[-1]

def fn(name):
    """(script, start, end) of lease.<name>'s final definition: from its CREATE
    [OR REPLACE] FUNCTION up to the next one."""
    n = where(name)
    t = texts[n]
    heads = list(re.finditer(HEAD % re.escape(name), t))
    if len(heads) != 1:
        sys.exit('defect %s: lease.%s is created %d times in %s, want 1' % (defect, name, len(heads), n))
    a = heads[0].start()
    m = re.compile(r'CREATE (?:OR REPLACE )?FUNCTION').search(t, a + 1)
    return n, a, (m.start() if m else len(t))

def body(name):
    n, a, b = fn(name)
    return texts[n][a:b]

def sub(name, old, new, count):
    """Replace the exactly `count` occurrences of old in lease.<name>'s final
    definition."""
    n, a, b = fn(name)
    t = texts[n]
    part = t[a:b]
    if part.count(old) != count:
        sys.exit('defect %s: %r occurs %d times in lease.%s (%s), want %d'
                 % (defect, old, part.count(old), name, n, count))
    texts[n] = t[:a] + part.replace(old, new) + t[b:]

def names():
    """Every function of schema lease, by name, once."""
    out = []
    for n in order:
        for m in re.finditer(r'CREATE (?:OR REPLACE )?FUNCTION lease\.(\w+)\(', texts[n]):
            if m.group(1) not in out:
                out.append(m.group(1))
    return out

if defect == 'control':
    pass
elif defect == '1_release_keeps_epoch':
    # (0.5.0 frees the key in its one-statement release and in the full way)
    pat = 'SET owner = NULL, epoch = l.epoch + 1, expires_at = v_now'
    sub('release', pat, 'SET owner = NULL, epoch = l.epoch, expires_at = v_now', max(1, body('release').count(pat)))
    # 0.5.0: the common case's one-statement release too
    if 'SET owner = NULL, epoch = l.epoch + 1, expires_at = clock_timestamp()' in body('release'):
        sub('release', 'SET owner = NULL, epoch = l.epoch + 1, expires_at = clock_timestamp()',
                       'SET owner = NULL, epoch = l.epoch, expires_at = clock_timestamp()', 1)
elif defect == '2_now_not_clock':
    # every reading of "now" that an expiry is compared with or computed from
    sub('acquire', 'v_now := clock_timestamp();', 'v_now := now();', 4)
    # ... except the blocking acquire's own deadline bookkeeping (else a wait
    # never ends and the suites hang instead of failing)
    sub('acquire', '    v_now := now();\n    IF v_now >= v_deadline THEN',
                   '    v_now := clock_timestamp();\n    IF v_now >= v_deadline THEN', 1)
    sub('renew', 'v_now := clock_timestamp();', 'v_now := now();', 1)
    # 0.5.0: the one-statement renewal and release decide in their row read
    pat = 'x.expires_at > clock_timestamp()'
    for f in ('renew', 'release'):
        if pat in body(f):
            sub(f, pat, 'x.expires_at > now()', 1)
    if 'lease._renew_key(' in body('renew'):
        # 0.5.0: the per-key routine behind renew's other answers and renew_many
        sub('_renew_key', 'now := coalesce(now, clock_timestamp());', 'now := coalesce(now, now());', 1)
    # 0.5.0 reads it twice (the one-statement release, and the full way)
    pat = 'v_now := clock_timestamp();'
    sub('release', pat, 'v_now := now();', max(1, body('release').count(pat)))
    # 0.5.0 reads the row twice (without a lock, then locked): both
    pat = 'v_owner, v_epoch, clock_timestamp());'
    sub('fence', pat, 'v_owner, v_epoch, now());', max(1, body('fence').count(pat)))
    sub('inspect', 'l.expires_at > clock_timestamp() AS h', 'l.expires_at > now() AS h', 1)
    sub('list', 'l.expires_at > clock_timestamp() AS h', 'l.expires_at > now() AS h', 1)
elif defect == '3_no_sync_forcing':
    # lease._changed's forcing, and that of any function that does its own
    # (0.1.0/0.2.0 forced 'local'; 0.3.0 forces 'on')
    pat = "PERFORM set_config('synchronous_commit', 'on', true);"
    if not any(pat in body(n) for n in names()):
        pat = "PERFORM set_config('synchronous_commit', 'local', true);"
    hit = [n for n in names() if pat in body(n)]
    if '_changed' not in hit:
        sys.exit('defect %s: forcing found in %s, want lease._changed among them' % (defect, hit))
    for n in hit:
        sub(n, pat, 'NULL;', body(n).count(pat))
elif defect == '4_lock_while_waiting':
    sub('acquire', '    PERFORM pg_sleep(greatest(0.0005, least(\n',
        '    PERFORM 1 FROM lease.leases l WHERE l.key = v_key FOR UPDATE;  -- DEFECT: kept while sleeping\n'
        '    PERFORM pg_sleep(greatest(0.0005, least(\n', 1)
elif defect == '5_renew_no_epoch_check':
    if 'v_owner, v_epoch, v_now);' in body('renew'):
        sub('renew', 'v_owner, v_epoch, v_now);', 'v_owner, r_epoch, v_now);', 1)
    else:
        # 0.5.0: the one-statement renewal, and the per-key routine behind
        # its other answers and renew_many
        sub('renew', 'AND x.epoch = v_epoch', 'AND x.epoch = x.epoch', 1)
        sub('_renew_key', 'r_lepoch, o, e, now);', 'r_lepoch, o, r_epoch, now);', 1)
elif defect == '6_inspect_lapsed_as_held':
    sub('inspect', 'l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h', 'l.owner IS NOT NULL AS h', 1)
else:
    sys.exit('unknown defect ' + defect)

if (texts == orig) != (defect == 'control'):
    sys.exit('defect %s: the scripts are %s' % (defect, 'unchanged' if texts == orig else 'changed'))
# The direct update scripts carry the full script's shared part verbatim
# (hack/gensql): the defect goes there too, so every update path has it.
SHARED = re.compile(r'^-- @shared-begin.*?^-- @shared-end[^\n]*\n', re.M | re.S)
if full in order and texts[full] != orig[full]:
    a, b = SHARED.search(orig[full]), SHARED.search(texts[full])
    for n in allnames:
        if n.endswith('--%s.sql' % version) and n.count('--') == 2:
            if orig[n].count(a.group(0)) != 1:
                sys.exit('defect %s: %s does not carry the shared part of %s' % (defect, n, full))
            texts[n] = orig[n].replace(a.group(0), b.group(0))
os.makedirs(dst, exist_ok=True)
for n in allnames:
    open(os.path.join(dst, n), 'w').write(texts[n])
plain = ''
for n in order:
    plain += texts[n] if texts[n].endswith('\n') else texts[n] + '\n'
open(os.path.join(dst, 'plain.sql'), 'w').write(plain)
PY
}

# run_sql_suites DEFECT DIR: regression and isolation against the broken copy.
run_sql_suites() {
  local d="$1" dir="$2"
  cp "$sqldir/pg_lease.control" "$dir"/pg_lease--*.sql "$extdir/"
  cp "$dir"/pg_lease--*.sql "$work/"
  rm -rf "$work/results" "$work/output_iso" "$work/regression.diffs" "$work/regression.out"
  local want=()
  for s in "${suites[@]}"; do case "$s" in regression|isolation) want+=("$s") ;; esac; done
  [ ${#want[@]} -gt 0 ] || return 0
  ( cd "$work" && PGISOLATIONTIMEOUT=30 timeout 1200 "$repo/hack/with-postgres.sh" --bindir "$sbin" -- bash -c '
      out="$1" d="$2"; shift 2
      # the broken script must install, or a failing suite would prove nothing
      if ! psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE defects_probe" \
             -c "\\c defects_probe" -c "CREATE EXTENSION pg_lease" -c "\\c postgres" \
             -c "DROP DATABASE defects_probe" >"$out/$d.install.log" 2>&1; then
        echo install-failed >"$out/$d.install.rc"; exit 0
      fi
      for s in "$@"; do
        start=$(date +%s)
        # NO_DUMP_CHECK=1: the suites themselves (the dump/restore check that
        # installcheck runs first is not one of the four, and a defect that
        # breaks its setup would stop both suites before any test ran)
        case "$s" in
          regression) make -s installcheck ISOLATION= NO_DUMP_CHECK=1 >"$out/$d.regression.log" 2>&1 && rc=0 || rc=$? ;;
          isolation)  make -s installcheck REGRESS=   NO_DUMP_CHECK=1 >"$out/$d.isolation.log" 2>&1 && rc=0 || rc=$? ;;
        esac
        echo "$rc $(( $(date +%s) - start ))" >"$out/$d.$s.rc"
      done' _ "$out" "$d" "${want[@]}" ) >"$out/$d.cluster.log" 2>&1 || true
  cp "$work/regression.diffs" "$out/$d.regression.diffs" 2>/dev/null || true
  cp "$work/output_iso/regression.diffs" "$out/$d.isolation.diffs" 2>/dev/null || true
}

declare -A result failing secs
# verdict DEFECT SUITE RC FAILED-TESTS: caught / missed (defect), pass / FAIL (control), error
verdict() {
  local d="$1" s="$2" rc="$3" tests="$4" v
  if [ "$rc" = 0 ]; then
    v=$([ "$d" = control ] && echo pass || echo missed)
  elif [ -n "$tests" ]; then
    v=$([ "$d" = control ] && echo FAIL || echo caught)
  else
    v=error
  fi
  result[$d.$s]="$v"; failing[$d.$s]="$tests"
}

for d in "$@"; do
  echo "== $d"
  dir="$scratch/defects/$d"
  make_defect "$d" "$dir"
  cp "$dir/plain.sql" "$out/$d.sql"
  if [ "$d" != control ]; then
    : >"$out/$d.patch"
    for f in "$dir"/pg_lease--*.sql; do
      diff -u "$sqldir/$(basename "$f")" "$f" >>"$out/$d.patch" || true
    done
  fi
  run_sql_suites "$d" "$dir"
  for s in "${suites[@]}"; do
    start=$(date +%s)
    case "$s" in
      regression|isolation)
        if [ -f "$out/$d.install.rc" ]; then
          result[$d.$s]=error; failing[$d.$s]="the script did not install (see $d.install.log)"; secs[$d.$s]=0; continue
        fi
        if [ ! -f "$out/$d.$s.rc" ]; then
          result[$d.$s]=error; failing[$d.$s]="no result (see $d.cluster.log)"; secs[$d.$s]=0; continue
        fi
        read -r rc "secs[$d.$s]" <"$out/$d.$s.rc"
        # pg_regress (15): "test 01_acquire ... FAILED"; 16+: "not ok 3 - name"
        tests=$(sed -nE 's/^(test |not ok [0-9]+ +- +)?[[:space:]]*([A-Za-z0-9_]+) +\.\.\. FAILED.*/\2/p; s/^not ok [0-9]+ +- +([A-Za-z0-9_]+).*/\1/p' \
                  "$out/$d.$s.log" | sort -u | tr '\n' ' ')
        verdict "$d" "$s" "$rc" "${tests% }"
        ;;
      failure)
        ( cd "$repo" && PGLEASE_FAILURE_SQL="$out/$d.sql" timeout 1200 go test -count=1 -timeout 15m ./test/failure ) \
          >"$out/$d.failure.log" 2>&1 && rc=0 || rc=$?
        secs[$d.$s]=$(( $(date +%s) - start ))
        if grep -q 'installing pg_lease (' "$out/$d.failure.log"; then
          result[$d.$s]=error; failing[$d.$s]="the script did not install (see $d.failure.log)"; continue
        fi
        tests=$(sed -nE 's/^ *--- FAIL: ([A-Za-z0-9_]+).*/\1/p' "$out/$d.failure.log" | sort -u | tr '\n' ' ')
        verdict "$d" "$s" "$rc" "${tests% }"
        ;;
      robustness)
        ( cd "$repo" && timeout 1200 "$scratch/pglease-robustness" -sql "$out/$d.sql" -seed "$seed" -duration "$duration" \
            -clients 8 -procs 4 -keys 3 -faults kill,proxy,stop,clock -out "$out/$d.history.json" ) \
          >"$out/$d.robustness.log" 2>&1 && rc=0 || rc=$?
        secs[$d.$s]=$(( $(date +%s) - start ))
        tests=""
        if [ "$rc" = 1 ]; then  # 1: violations found; 2: the run itself failed
          # "violations: N", the rules of the (first ten) reported ones, and porcupine's verdict
          tests="$(sed -nE 's/^violations: ([0-9]+)$/\1 violations:/p' "$out/$d.robustness.log" | head -n 1)"
          tests+=" $(sed -nE 's/^VIOLATION ([A-Za-z0-9_]+) .*/\1/p' "$out/$d.robustness.log" | sort -u | tr '\n' ' ')"
          grep -q 'Illegal' "$out/$d.robustness.log" && tests+="porcupine:$(sed -nE 's/^linearizable \(porcupine, per key\): //p' "$out/$d.robustness.log" | tr ' ' ',')"
          tests="$(echo $tests)"
          [ -n "$tests" ] || tests="violations"
        fi
        verdict "$d" "$s" "$rc" "${tests% }"
        ;;
    esac
    printf '   %-11s %-7s %4ss  %s\n' "$s" "${result[$d.$s]}" "${secs[$d.$s]}" "${failing[$d.$s]}"
  done
done

# --- the table ---
status=0
{
  printf '\n%-26s' "defect"; for s in "${suites[@]}"; do printf ' %-11s' "$s"; done; printf '\n'
  for d in "$@"; do
    printf '%-26s' "$d"
    any=0
    for s in "${suites[@]}"; do
      printf ' %-11s' "${result[$d.$s]}"
      case "${result[$d.$s]}" in caught) any=1 ;; pass) ;; FAIL|error) [ "$d" = control ] && status=1 ;; esac
    done
    if [ "$d" != control ] && [ "$any" = 0 ]; then printf '  <- missed by every suite'; status=1; fi
    printf '\n'
  done
  printf '\nfailing tests (per defect and suite; logs in %s):\n' "$out"
  for d in "$@"; do
    for s in "${suites[@]}"; do
      if [ -n "${failing[$d.$s]}" ]; then printf '  %-26s %-11s %s\n' "$d" "$s" "${failing[$d.$s]}"; fi
    done
  done
  printf '\nseconds per suite run:\n'
  for d in "$@"; do
    printf '  %-26s' "$d"; for s in "${suites[@]}"; do printf ' %s=%s' "$s" "${secs[$d.$s]}"; done; printf '\n'
  done
} | tee "$out/table.txt"
[ "$status" = 0 ] && echo "defects.sh: OK" || echo "defects.sh: FAILED (a defect missed by every suite, or the control failed)"
exit "$status"
