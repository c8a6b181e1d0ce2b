#!/usr/bin/env bash
# dump_restore.sh: pg_dump and restore keep pg_lease's state: every row of lease.leases, the epoch floor, the settings, the
# recorded timeline, the leadership history (0.4.0) with its retention and the handover strategies (0.4.0), in plain format (restored with psql) and custom format
# (restored with pg_restore), both with errors fatal, so a restore that
# conflicts with the rows CREATE EXTENSION makes fails the test.
#
#   PGHOST=... PGPORT=... PGUSER=<superuser> sql/test/dump/dump_restore.sh
#
# Uses pg_dump, pg_restore and psql from PGLEASE_PG_BINDIR (the server's own
# major: an older pg_dump refuses a newer server), psql from
# PGLEASE_PG_CLIENT_BINDIR if set; pg_lease must be installed in the server's
# extension directory. Makes databases regress_pglease_dump_* and drops them.
# Exits non-zero, with the differing lines, when anything is lost or changed.
set -euo pipefail

bindir=${PGLEASE_PG_BINDIR:-}
if [[ -z $bindir ]]; then
	bindir=$(dirname "$(command -v pg_dump 2>/dev/null || echo /nonexistent/pg_dump)")
fi
psql=${PGLEASE_PG_CLIENT_BINDIR:-$bindir}/psql
[[ -x $psql ]] || psql=$(command -v psql || true)
for t in "$bindir/pg_dump" "$bindir/pg_restore" "$psql"; do
	[[ -n $t && -x $t ]] || {
		echo "dump_restore: $t not found: install the PostgreSQL client of the server's major (e.g. apt-get install postgresql-client-15) or set PGLEASE_PG_BINDIR" >&2
		exit 1
	}
done
work=$(mktemp -d /tmp/pglease-dump.XXXXXX)
trap 'rm -rf "$work"' EXIT

q() { "$psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
src=regress_pglease_dump_src
dbs=("$src" regress_pglease_dump_plain regress_pglease_dump_custom)
for d in "${dbs[@]}"; do q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $d"; done
q -d postgres -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS regress_pglease_dump_app" \
	-c "DROP ROLE IF EXISTS regress_pglease_dump_other" -c "CREATE ROLE regress_pglease_dump_app" -c "CREATE ROLE regress_pglease_dump_other"
q -d postgres -c "CREATE DATABASE $src"

# Keys in every state; a key whose counter reached 7 is cleaned up (floor 7);
# an operator setting; a grant bound to another role.
q -d "$src" >"$work/setup.log" <<'SQL'
CREATE EXTENSION pg_lease;
SELECT * FROM lease.configure(max_ttl => interval '10 min');
DO $$
DECLARE e bigint;
BEGIN
  FOR i IN 1..3 LOOP
    SELECT a.epoch INTO e FROM lease.acquire('d-seven', 's1', interval '10 min') a;
    PERFORM lease.release('d-seven', 's1', e);
  END LOOP;
END $$;
SELECT epoch FROM lease.acquire('d-seven', 's1', interval '1ms');   -- 7, lapses
SELECT pg_sleep(0.01);
SELECT acquired FROM lease.acquire('d-held', 'h1', interval '10 min');
SELECT acquired FROM lease.acquire('d-lapsed', 'l1', interval '1ms');
SELECT acquired FROM lease.acquire('d-free', 'f1', interval '10 min');
SELECT status FROM lease.release('d-free', 'f1', 1);
-- the oldest expiry only: d-seven goes, the floor becomes 7
SELECT removed, epoch_floor FROM lease.cleanup(interval '0', 1);
SELECT lease.configure_history(50);
SET SESSION AUTHORIZATION regress_pglease_dump_app;
SELECT acquired FROM lease.acquire('d-app', 'a1', interval '10 min');
SELECT previous FROM lease.set_strategy('d-app', 'newest_version');
RESET SESSION AUTHORIZATION;
SQL

state() { # DB: everything the restore must keep, as text
	q -d "$1" -A -t <<-'SQL'
		SELECT 'leases', l.* FROM lease.leases l ORDER BY key;
		SELECT 'status', s.max_ttl, s.promotion_grace, s.timeline, s.era, s.grace_until, s.epoch_floor FROM lease.status() s;
		SELECT 'settings', s.* FROM lease.settings s;
		SELECT 'history', h.* FROM lease.history h ORDER BY key, seq;
		SELECT 'history_settings', s.* FROM lease.history_settings s;
		SELECT 'strategies', s.* FROM lease.strategies s ORDER BY key;
	SQL
}
state "$src" >"$work/src.state"
grep -q '^status|.*|7$' "$work/src.state" || { echo "dump_restore: setup did not reach floor 7:"; cat "$work/src.state"; exit 1; } >&2
grep -q '^history|d-held|1|' "$work/src.state" && grep -q '^history_settings|t|50$' "$work/src.state" ||
	{ echo "dump_restore: setup recorded no history or retention:"; cat "$work/src.state"; exit 1; } >&2
grep -q '^strategies|d-app|newest_version|regress_pglease_dump_app|' "$work/src.state" ||
	{ echo "dump_restore: setup set no strategy:"; cat "$work/src.state"; exit 1; } >&2

"$bindir/pg_dump" -Fp -f "$work/dump.sql" "$src"
"$bindir/pg_dump" -Fc -f "$work/dump.custom" "$src"
q -d postgres -c "CREATE DATABASE regress_pglease_dump_plain" -c "CREATE DATABASE regress_pglease_dump_custom"
q -d regress_pglease_dump_plain -f "$work/dump.sql" >"$work/restore-plain.log" 2>&1 ||
	{ echo "dump_restore: plain restore failed:" >&2; cat "$work/restore-plain.log" >&2; exit 1; }
"$bindir/pg_restore" --exit-on-error -d regress_pglease_dump_custom "$work/dump.custom" >"$work/restore-custom.log" 2>&1 ||
	{ echo "dump_restore: pg_restore failed:" >&2; cat "$work/restore-custom.log" >&2; exit 1; }

rc=0
for fmt in plain custom; do
	db=regress_pglease_dump_$fmt
	state "$db" >"$work/$fmt.state"
	if ! diff -u "$work/src.state" "$work/$fmt.state"; then
		echo "dump_restore: $fmt: the restored state differs from the dumped one (above)" >&2
		rc=1
		continue
	fi
	# After the restore: the cleaned key and a new key start above the floor,
	# the counters continue, the holders keep their grants (and their roles).
	got=$(q -d "$db" -A -t <<-'SQL'
		SELECT 'seven', epoch FROM lease.acquire('d-seven', 'n1', interval '1 min');
		SELECT 'new', epoch FROM lease.acquire('d-new', 'n1', interval '1 min');
		SELECT 'free', epoch FROM lease.acquire('d-free', 'n1', interval '1 min');
		SELECT 'lapsed', epoch FROM lease.acquire('d-lapsed', 'n1', interval '1 min');
		SELECT 'held', status FROM lease.renew('d-held', 'h1', 1, interval '1 min');
		SET SESSION AUTHORIZATION regress_pglease_dump_other;
		SELECT 'app-by-other-role', status FROM lease.renew('d-app', 'a1', 8, interval '1 min');
		SET SESSION AUTHORIZATION regress_pglease_dump_app;
		SELECT 'app', status FROM lease.renew('d-app', 'a1', 8, interval '1 min');
		RESET SESSION AUTHORIZATION;
		SELECT 'rows', count(*) FROM lease.leases;
	SQL
	)
	want=$'seven|8\nnew|8\nfree|3\nlapsed|2\nheld|ok\napp-by-other-role|not_owner\napp|ok\nrows|6'
	if [[ $got != "$want" ]]; then
		echo "dump_restore: $fmt: after the restore got:" >&2
		echo "$got" >&2
		echo "want:" >&2
		echo "$want" >&2
		rc=1
	fi
	# The restored max_ttl (10 min) is enforced.
	if q -d "$db" -c "SELECT lease.acquire('d-long', 'n1', interval '11 min')" >/dev/null 2>&1; then
		echo "dump_restore: $fmt: a ttl above the restored max_ttl was accepted" >&2
		rc=1
	fi
done

# The recorded era survives too: a source whose timeline state is of era 1
# (as after a promotion; its grace long over) grants above era 1's base
# (2^40) after the restore. Without the state the restore would start again
# at era 0, and a key whose last grants were lost with the old primary could
# be granted their epochs again.
era_src=regress_pglease_dump_era_src era_dst=regress_pglease_dump_era_dst
dbs+=("$era_src" "$era_dst")
q -d postgres -c "CREATE DATABASE $era_src" -c "CREATE DATABASE $era_dst"
q -d "$era_src" >"$work/era-setup.log" <<'SQL'
CREATE EXTENSION pg_lease;
UPDATE lease.timeline_state SET era = 1, grace_until = timestamptz '2000-01-01 00:00:00+00';
SQL
"$bindir/pg_dump" -Fp -f "$work/era.sql" "$era_src"
q -d "$era_dst" -f "$work/era.sql" >"$work/restore-era.log" 2>&1 ||
	{ echo "dump_restore: era restore failed:" >&2; cat "$work/restore-era.log" >&2; exit 1; }
got=$(q -d "$era_dst" -A -t -c "SELECT 'era', era FROM lease.status()" \
	-c "SELECT 'above_base', epoch > (1::bigint << 40) FROM lease.acquire('d-era', 'e1', interval '1 min')")
if [[ $got != $'era|1\nabove_base|t' ]]; then
	echo "dump_restore: the restore lost the recorded era: got" >&2
	echo "$got" >&2
	rc=1
fi

for d in "${dbs[@]}"; do q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $d"; done
q -d postgres -c "DROP ROLE IF EXISTS regress_pglease_dump_app" -c "DROP ROLE IF EXISTS regress_pglease_dump_other"
[[ $rc -eq 0 ]] && echo "dump_restore: plain and custom format keep every lease row, the floor (7), the settings, the timeline state (its era), the history and the handover strategies"
exit $rc
