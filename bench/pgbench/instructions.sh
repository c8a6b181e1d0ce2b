#!/usr/bin/env bash
# Instructions per call of lease.renew, its scratch variants (scratch.sql) and
# the bare UPDATE, counted by valgrind (callgrind) in a single-user backend:
# the same on a loaded machine as on a quiet one, so variants can be compared
# while other work runs (a pgbench run's latency and CPU cannot be then).
# Each figure is the difference between a session of 420 calls and one of 20,
# divided by 400: the call with its commit, without the session's start.
# Single-user mode has no autovacuum and no concurrency: these are the costs
# of one call, not of 16 clients' contention.
#
#   bench/pgbench/instructions.sh [NAME...]    (default: all below)
#
# Needs valgrind and the PostgreSQL server binaries ($PGLEASE_PG_BINDIR, else
# pg_config's), with pg_lease installed into them. About 20 s per name.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bindir="${PGLEASE_PG_BINDIR:-$(pg_config --bindir)}"
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }

args="('r-1', 'c1', 1, interval '1 h')"
declare -A stmt=(
	[bare]="UPDATE bench.bare SET expires_at = clock_timestamp() + interval '1 h' WHERE key = 'r-1' AND owner = 'c1' AND epoch = 1 AND expires_at > clock_timestamp() RETURNING expires_at"
	[plupdate]="SELECT status FROM scratch.update_definer$args"
	[emptydef]="SELECT status FROM scratch.empty_definer$args"
	[renew]="SELECT status FROM lease.renew$args"
)
for v in copy ctid one onesub noset notl noplan; do
	stmt[r5_$v]="SELECT status FROM scratch.r5_$v$args"
done
names=("$@")
((${#names[@]})) || names=(bare plupdate emptydef renew r5_copy r5_ctid r5_one r5_onesub r5_noset r5_notl r5_noplan)

dir="$(mktemp -d "${TMPDIR:-/tmp}/pglease-instr.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
# PostgreSQL refuses to run as root: then the server runs as nobody.
as=()
if [[ $(id -u) == 0 ]]; then
	chown nobody "$dir"
	as=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
fi
"${as[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
"${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -o "-k $dir -c listen_addresses= -p 55439" -l "$dir/log" -w start >/dev/null
psql=("$bindir/psql" -h "$dir" -p 55439 -U postgres -X -q -v ON_ERROR_STOP=1)
# (a single-user backend connects as the OS user that runs it)
"${psql[@]}" -c 'CREATE DATABASE bench' -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$("${as[@]}" id -un)') THEN
	CREATE ROLE \"$("${as[@]}" id -un)\" SUPERUSER; END IF; END \$\$" >/dev/null
"${psql[@]}" bench >/dev/null <<'SQL'
CREATE EXTENSION pg_lease;
SELECT lease.configure(max_ttl => interval '1000 h');
CREATE SCHEMA bench;
CREATE TABLE bench.bare (key text NOT NULL PRIMARY KEY, owner text, epoch bigint NOT NULL CHECK (epoch >= 1),
  expires_at timestamptz NOT NULL, acquired_at timestamptz NOT NULL, lapsed_owner text, lapsed_epoch bigint)
  WITH (fillfactor = 50);
INSERT INTO bench.bare (key, owner, epoch, expires_at, acquired_at) VALUES ('r-1', 'c1', 1, now() + interval '100 h', now());
SQL
"${psql[@]}" bench -f scratch.sql >/dev/null 2>&1
"${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -w stop >/dev/null

# ir N STATEMENT: instructions of a single-user session that holds r-1 (made
# in this server life, as a grant of it would be) and runs STATEMENT N times.
ir() {
	local in="$dir/in" out="$dir/cg.out"
	{
		echo "INSERT INTO lease.leases (key, owner, epoch, expires_at, acquired_at, holder_role, life, life_timeline) VALUES ('r-1', 'c1', 1, now() + interval '100 h', now(), session_user, pg_postmaster_start_time(), lease._timeline()) ON CONFLICT (key) DO UPDATE SET owner = 'c1', epoch = 1, expires_at = now() + interval '100 h', holder_role = session_user, life = pg_postmaster_start_time(), life_timeline = lease._timeline()"
		echo "PREPARE p AS $2"
		for ((i = 0; i < $1; i++)); do echo "EXECUTE p"; done
	} >"$in"
	rm -f "$out"
	"${as[@]}" valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$bindir/postgres" --single -D "$dir/data" -c fsync=off bench <"$in" >"$dir/session.log" 2>&1
	if grep -q ERROR "$dir/session.log"; then
		grep -m1 ERROR "$dir/session.log" >&2
		return 1
	fi
	awk '/^summary:/ {print $2}' "$out"
}

echo "| call | instructions per call | ÷ bare |"
echo "|---|---|---|"
bare=""
for n in "${names[@]}"; do
	[[ -n ${stmt[$n]:-} ]] || { echo "instructions.sh: unknown name $n" >&2; exit 2; }
	a=$(ir 20 "${stmt[$n]}")
	b=$(ir 420 "${stmt[$n]}")
	per=$(((b - a) / 400))
	[[ $n == bare ]] && bare=$per
	if [[ -n $bare ]]; then
		echo "| $n | $per | $(awk -v p="$per" -v b="$bare" 'BEGIN {printf "%.2f×", p / b}') |"
	else
		echo "| $n | $per | |"
	fi
done
