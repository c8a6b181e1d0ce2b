#!/usr/bin/env bash
# Proves that the suites catch each safety point being broken: for every break
# below, installs a deliberately broken copy of the SQL that CREATE EXTENSION
# runs (the default version's full script, sql/pg_lease--0.5.0.sql, and the
# same shared part of the direct update scripts), runs the dump check and the
# regression and isolation suites against a throwaway cluster, and records
# which tests failed. Every substitution asserts how often its text occurs, so a break
# that no longer applies fails loudly instead of testing an unbroken copy.
# Never commit a break.
#
#   sql/test/prove-breaks.sh [BREAK...]      (default: all)
#
# The broken copy never goes into the shared extension directory (other work
# on the machine installs and uses pg_lease at the same time): the script
# copies the PostgreSQL installation (bin, lib, share: about 50 MB) into a
# temporary directory, which PostgreSQL's relocatable layout then treats as
# its own share directory, and starts the throwaway clusters from that copy.
# Results: one log and the diffs per break in $PROVE_BREAKS_OUT
# (default /tmp/pg_lease-breaks). Exit status: 0 when the control passed and
# every break failed at least one test; 1 otherwise; 2 on a usage error.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sqldir="$(dirname "$here")"
repo="$(dirname "$sqldir")"
out="${PROVE_BREAKS_OUT:-/tmp/pg_lease-breaks}"
mkdir -p "$out"

all=(none a_no_subxact b1_clock_before_lock_acquire b2_now_in_renew c_no_sync_forcing
     d1_no_security_definer d2_no_search_path e_public_select f_release_keeps_epoch
     g_renew_no_epoch_check h_inspect_lapsed_as_held i_wait0_lock_waits j_may_act_always
     k_listen_keeps_lock l_listen_no_first_grant_wait m_listen_under_all_no_wait
     n_changed_ignores_all)
# Breaks that the SQL suites cannot show: the Go test (package:TestName) that
# catches each, run in a copy of the module whose embedded SQL is the broken
# copy, against servers started from the private PostgreSQL copy.
declare -A gotest=([a_no_subxact]="./test/hardening:TestWaitingLoserKeepsNoLock")
[ $# -gt 0 ] || set -- "${all[@]}"
for brk in "$@"; do
  case " ${all[*]} " in *" $brk "*) ;; *) echo "prove-breaks.sh: unknown break $brk (known: ${all[*]})" >&2; exit 2 ;; esac
done

. "$repo/hack/lib/private-pg.sh"
private_pg breaks-pg "$sqldir"

status=0
for brk in "$@"; do
  rm -f "$extdir"/pg_lease.control "$extdir"/pg_lease--*.sql
  cp "$sqldir"/pg_lease.control "$extdir/"
  python3 - "$sqldir" "$extdir" "$brk" <<'PY'
import glob, os, re, sys
src, dst, brk = sys.argv[1:4]
version = re.search(r"^default_version = '([^']+)'", open(os.path.join(src, 'pg_lease.control')).read(), re.M).group(1)
full = 'pg_lease--%s.sql' % version
names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(src, 'pg_lease--*.sql')))
if full not in names:
    sys.exit('break %s: no full script %s for the default version' % (brk, full))
texts = {n: open(os.path.join(src, n)).read() for n in names}
orig = texts[full]
s = orig
HEAD = r'CREATE (?:OR REPLACE )?FUNCTION lease\.%s\('

def fn(name):
    """(start, end) of lease.<name> in the full script: from its CREATE
    [OR REPLACE] FUNCTION up to the next one."""
    heads = list(re.finditer(HEAD % re.escape(name), s))
    if len(heads) != 1:
        sys.exit('break %s: lease.%s is created %d times in %s, want 1' % (brk, name, len(heads), full))
    a = heads[0].start()
    m = re.compile(r'CREATE (?:OR REPLACE )?FUNCTION').search(s, a + 1)
    return a, (m.start() if m else len(s))

def sub(name, old, new, count=1):
    """Replaces the exactly `count` occurrences of old in lease.<name>."""
    global s
    a, b = fn(name)
    part = s[a:b]
    if part.count(old) != count:
        sys.exit('break %s: %r occurs %d times in lease.%s, want %d' % (brk, old, part.count(old), name, count))
    s = s[:a] + part.replace(old, new) + s[b:]

SYNC = "PERFORM set_config('synchronous_commit', 'on', true);"
if brk == 'none':
    pass  # control run: the suites pass on the real scripts
elif brk == 'a_no_subxact':
    # acquire: a race or denial after the row lock keeps the lock (CONTINUE
    # leaves the block without rolling its subtransaction back)
    sub('acquire', "RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- row removed: start over", 'CONTINUE;')
    sub('acquire', "-- Granted to someone (maybe this owner) since the unlocked read.\n"
                   "              RAISE EXCEPTION USING ERRCODE = 'LEASE';",
        "-- Granted to someone (maybe this owner) since the unlocked read.\n              CONTINUE;")
elif brk == 'b1_clock_before_lock_acquire':
    # acquire: keep the clock reading taken before the row lock
    sub('acquire', "            v_now := clock_timestamp();\n            IF r_owner IS NOT NULL AND r_expires > v_now THEN",
                   "            IF r_owner IS NOT NULL AND r_expires > v_now THEN")
elif brk == 'b2_now_in_renew':
    # renew (lease._renew_key, renew_many's routine too): transaction start
    # time instead of the clock after the lock
    sub('_renew_key', 'now := coalesce(now, clock_timestamp());', 'now := coalesce(now, pg_catalog.now());')
elif brk == 'c_no_sync_forcing':
    every = dict.fromkeys(re.findall(r'CREATE (?:OR REPLACE )?FUNCTION lease\.(\w+)\(', s))
    hit = [n for n in every if SYNC in s[slice(*fn(n))]]
    if '_changed' not in hit:
        sys.exit('break %s: forcing found in %s, want lease._changed among them' % (brk, hit))
    for n in hit:
        sub(n, SYNC, 'NULL;', s[slice(*fn(n))].count(SYNC))
elif brk == 'd1_no_security_definer':
    sub('acquire', 'LANGUAGE plpgsql VOLATILE SECURITY DEFINER', 'LANGUAGE plpgsql VOLATILE')
elif brk == 'd2_no_search_path':
    sub('acquire', 'SET search_path = pg_catalog, pg_temp\n', '')
elif brk == 'e_public_select':
    s += '\nGRANT SELECT ON TABLE lease.leases TO PUBLIC;\n'
elif brk == 'f_release_keeps_epoch':
    sub('release', 'SET owner = NULL, epoch = l.epoch + 1,', 'SET owner = NULL, epoch = l.epoch,')
elif brk == 'g_renew_no_epoch_check':
    # renew checks the row's epoch instead of the caller's
    sub('_renew_key', 'r_lowner, r_lepoch, o, e, now);', 'r_lowner, r_lepoch, o, r_epoch, now);')
elif brk == 'h_inspect_lapsed_as_held':
    sub('inspect', 'l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h', 'l.owner IS NOT NULL AS h')
elif brk == 'i_wait0_lock_waits':
    # a wait-0 acquire waits for the row lock of a lapsed grant (no NOWAIT)
    sub('acquire', 'FOR NO KEY UPDATE NOWAIT;', 'FOR NO KEY UPDATE;')
elif brk == 'j_may_act_always':
    # no role check: any role may renew, release or fence another role's grant
    sub('_may_act', 'BEGIN\n  IF holder_role IS NULL', 'BEGIN\n  RETURN true;\n  IF holder_role IS NULL')
elif brk == 'k_listen_keeps_lock':
    # listen(key) keeps its FOR SHARE on the row to the end of the caller's transaction
    sub('listen', "          PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE;\n"
                  "        END IF;\n      END IF;\n      RAISE EXCEPTION USING ERRCODE = 'LEASE';",
        "          PERFORM FROM lease.leases l WHERE l.key = v_key FOR SHARE;\n"
        "        END IF;\n      END IF;\n      NULL;")
elif brk == 'l_listen_no_first_grant_wait':
    # listen(key) does not wait for a first grant in flight
    sub('listen', "        INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, acquired_at)\n"
                  "          VALUES (v_key, NULL, 1, clock_timestamp(), clock_timestamp())\n"
                  "          ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;",
        "        PERFORM 1 WHERE false;")
elif brk == 'm_listen_under_all_no_wait':
    # under a registration of '*', listen(key) answers without waiting for
    # the key's change in flight
    sub('listen', "    SELECT w.since INTO v_since FROM lease.listeners w WHERE w.key = '*' AND w.pid = v_pid;\n",
        "    SELECT w.since INTO v_since FROM lease.listeners w WHERE w.key = '*' AND w.pid = v_pid;\n"
        "    IF FOUND THEN\n      RETURN v_since < transaction_timestamp();\n    END IF;\n")
elif brk == 'n_changed_ignores_all':
    # a change notifies only registrations of its key, not those of '*'
    sub('_changed', "w.key = _changed.key OR w.key = '*'", "w.key = _changed.key")
else:
    sys.exit('unknown break ' + brk)
if (s == orig) != (brk == 'none'):
    sys.exit('break %s: the script is %s' % (brk, 'unchanged' if s == orig else 'changed'))
texts[full] = s
# The direct update scripts carry the full script's shared part verbatim
# (hack/gensql): the break goes there too.
SHARED = re.compile(r'^-- @shared-begin.*?^-- @shared-end[^\n]*\n', re.M | re.S)
a, b = SHARED.search(orig), SHARED.search(s)
if a.group(0) != b.group(0):
    for n in names:
        if n.endswith('--%s.sql' % version) and n.count('--') == 2:
            if texts[n].count(a.group(0)) != 1:
                sys.exit('break %s: %s does not carry the shared part of %s' % (brk, n, full))
            texts[n] = texts[n].replace(a.group(0), b.group(0))
for n in names:
    open(os.path.join(dst, n), 'w').write(texts[n])
PY
  echo "== $brk"
  rm -rf "$work/results" "$work/output_iso" "$work/regression.diffs"
  rc=0
  # The dump check and both suites, each on its own (installcheck runs the
  # dump check as a prerequisite, and both suites in one recipe: a failure
  # would skip what follows).
  ( cd "$work" && PGISOLATIONTIMEOUT=30 "$repo/hack/with-postgres.sh" --bindir "$sbin" -- bash -c \
      'rc=0; test/dump/dump_restore.sh || { rc=1; echo "test dump_restore.sh ... FAILED"; }
       make -s installcheck NO_DUMP_CHECK=1 ISOLATION= || rc=1
       make -s installcheck NO_DUMP_CHECK=1 REGRESS= || rc=1; exit $rc' \
      >"$out/$brk.log" 2>&1 ) || rc=$?
  if [ -n "${gotest[$brk]:-}" ]; then
    mod="$scratch/module"
    if [ ! -d "$mod" ]; then
      mkdir -p "$mod"
      (cd "$repo" && git ls-files -z | xargs -0 tar -cf -) | tar -xf - -C "$mod"
    fi
    cp "$extdir"/pg_lease--*.sql "$mod/sql/"
    pkg="${gotest[$brk]%%:*}" run="${gotest[$brk]#*:}"
    ( cd "$mod" && PGLEASE_PG_BINDIR="$sbin" PATH="$PATH:/usr/local/go/bin" \
        go test -count=1 -run "^$run\$" "$pkg" ) >>"$out/$brk.log" 2>&1 || rc=$?
    cp "$sqldir"/pg_lease--*.sql "$mod/sql/"
  fi
  cp "$work/regression.diffs" "$out/$brk.regress.diffs" 2>/dev/null || true
  cp "$work/output_iso/regression.diffs" "$out/$brk.isolation.diffs" 2>/dev/null || true
  failed="$(grep -E '^(not ok|test .* FAILED|--- FAIL: )|\.\.\. FAILED|failed \(' "$out/$brk.log" || true)"
  if [ -n "$failed" ]; then
    echo "$failed" | sed 's/^/   /'
  else
    echo "   (no test failed)"
  fi
  if [ "$brk" = none ]; then
    [ "$rc" = 0 ] && [ -z "$failed" ] || { echo "   the control did not pass"; status=1; }
  elif [ -z "$failed" ]; then
    echo "   NOT CAUGHT"; status=1
  fi
done
exit "$status"
