#!/usr/bin/env bash
# Proves that the suites catch each safety point being broken: for every break
# below, installs a deliberately broken copy of pg_lease--0.1.0.sql, runs the
# regression and isolation suites against a throwaway cluster, and records
# which tests failed. Never commit a break.
#
#   sql/test/prove-breaks.sh [BREAK...]      (default: all)
#
# The broken copy never goes into the shared extension directory (other work
# on the machine installs and uses pg_lease at the same time): the script
# copies the PostgreSQL installation (bin, lib, share: about 50 MB) into a
# temporary directory, which PostgreSQL's relocatable layout then treats as
# its own share directory, and starts the throwaway clusters from that copy.
# Results: one log and the diffs per break in $PROVE_BREAKS_OUT
# (default /tmp/pg_lease-breaks).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sqldir="$(dirname "$here")"
repo="$(dirname "$sqldir")"
out="${PROVE_BREAKS_OUT:-/tmp/pg_lease-breaks}"
mkdir -p "$out"

. "$repo/hack/lib/private-pg.sh"
private_pg breaks-pg "$sqldir"
cp "$sqldir"/pg_lease.control "$sqldir"/pg_lease--*.sql "$extdir/"

all=(none a_no_subxact b1_clock_before_lock_acquire b2_now_in_renew c_no_sync_forcing
     d1_no_security_definer d2_no_search_path e_public_select f_release_keeps_epoch
     g_renew_no_epoch_check h_inspect_lapsed_as_held)
[ $# -gt 0 ] || set -- "${all[@]}"

for brk in "$@"; do
  python3 - "$sqldir/pg_lease--0.1.0.sql" "$extdir/pg_lease--0.1.0.sql" "$brk" <<'PY'
import sys
src, dst, brk = sys.argv[1:4]
s = open(src).read()

def fn(name):
    """(start, end) of CREATE FUNCTION lease.<name> up to the next CREATE FUNCTION."""
    a = s.index('CREATE FUNCTION lease.%s(' % name)
    b = s.find('CREATE FUNCTION', a + 1)
    return a, (b if b >= 0 else len(s))

def sub(name, old, new, count=1):
    global s
    a, b = fn(name)
    body = s[a:b]
    assert body.count(old) >= count, (brk, name, old)
    s = s[:a] + body.replace(old, new, count) + s[b:]

if brk == 'none':
    pass  # control run: the suites pass on the real script
elif brk == 'a_no_subxact':
    # acquire: no subtransaction around the lock; a race or denial keeps it
    sub('acquire', "RAISE EXCEPTION USING ERRCODE = 'LEASE';  -- row removed: start over", 'CONTINUE;')
    sub('acquire', "          -- Granted to someone (maybe this owner) since the unlocked read.\n          RAISE EXCEPTION USING ERRCODE = 'LEASE';",
        '          CONTINUE;')
    sub('acquire', "      EXCEPTION WHEN SQLSTATE 'LEASE' THEN\n        -- The lock, if taken, is gone with the subtransaction. Read again.\n        CONTINUE;\n", '')
elif brk == 'b1_clock_before_lock_acquire':
    # acquire: keep the clock reading taken before the row lock
    sub('acquire', "        END IF;\n        v_now := clock_timestamp();\n        IF r_owner IS NOT NULL AND r_expires > v_now THEN",
        "        END IF;\n        IF r_owner IS NOT NULL AND r_expires > v_now THEN")
elif brk == 'b2_now_in_renew':
    # renew: transaction/statement start time instead of the clock after the lock
    sub('renew', 'v_now := clock_timestamp();', 'v_now := now();')
elif brk == 'c_no_sync_forcing':
    sub('_changed', "PERFORM set_config('synchronous_commit', 'local', true);", 'NULL;')
elif brk == 'd1_no_security_definer':
    sub('acquire', 'LANGUAGE plpgsql VOLATILE SECURITY DEFINER', 'LANGUAGE plpgsql VOLATILE')
elif brk == 'd2_no_search_path':
    sub('acquire', 'SET search_path = pg_catalog, pg_temp\n', '')
elif brk == 'e_public_select':
    s += '\nGRANT SELECT ON TABLE lease.leases TO PUBLIC;\n'
elif brk == 'f_release_keeps_epoch':
    sub('release', 'SET owner = NULL, epoch = l.epoch + 1,', 'SET owner = NULL, epoch = l.epoch,')
elif brk == 'g_renew_no_epoch_check':
    sub('renew', 'v_owner, v_epoch, v_now);', 'v_owner, r_epoch, v_now);')
elif brk == 'h_inspect_lapsed_as_held':
    sub('inspect', 'l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS h', 'l.owner IS NOT NULL AS h')
else:
    sys.exit('unknown break ' + brk)
open(dst, 'w').write(s)
PY
  echo "== $brk"
  rm -rf "$work/results" "$work/output_iso" "$work/regression.diffs"
  ( cd "$work" && PGISOLATIONTIMEOUT=30 "$repo/hack/with-postgres.sh" --bindir "$sbin" -- make -s installcheck -k \
      >"$out/$brk.log" 2>&1 ) || true
  cp "$work/regression.diffs" "$out/$brk.regress.diffs" 2>/dev/null || true
  cp "$work/output_iso/regression.diffs" "$out/$brk.isolation.diffs" 2>/dev/null || true
  grep -E '^(not ok|test .* FAILED)|\.\.\. FAILED|failed \(' "$out/$brk.log" | sed 's/^/   /' || echo "   (no test failed)"
done
