#!/usr/bin/env bash
# Runs every pg_lease benchmark and records the environment, into
# bench/results/<UTC timestamp>/ (or $BENCH_OUT):
#
#   env.txt        PostgreSQL, pgbench, Go, OS, kernel, CPU, memory, storage, load
#   physical.*     the limits: pg_test_fsync flush time, SELECT 1 round trip, a bare
#                  durable one-row UPDATE commit (every figure is also a ratio to them)
#   pgbench.*      W1-cycle, W2-contend and R (renew) vs bare-SQL baselines, for
#                  this version and 0.3.0 (a second database of the same server)
#   account.*      per statement: what each kind of call (first grant, grant,
#                  idempotent re-acquire, renew, release, takeover, handover)
#                  runs inside its function and what each statement costs
#                  (pg_stat_statements, track = all), 0.3.0, 0.4.0 and this version
#   handoff.*      handoff/takeover for pkg/elector, client-go + pkg/resourcelock
#                  (each also with a handover to a registered candidate),
#                  client-go + LeaseLock on kube-apiserver, beside the baseline
#                  (two durable commits and one notification); handoff.svg (ECDF plot)
#   handoff-200/   (full only) the pg_lease handoffs alone at controller-runtime's
#                  timings (15 s / 10 s / 2 s), 200 trials each, interleaved with
#                  the baseline, each traced (where the time goes)
#   elector-200/   (full only) pkg/elector alone, fast profile, 200 trials, pools
#                  warmed by lease.WarmConn and cold ones (elector-cold), interleaved
#   firstreconcile.log examples/operator on the real kube-apiserver:
#                  SIGTERM of the leader to the successor's first Reconcile,
#                  pg_lease and the Lease lock, cold and warm caches (test/e2e)
#   scale.*        1k/10k/100k keys renew throughput, size after 10M renewals, HOT
#                  ratio, lease.cleanup size benefit
#   waiters.*      1,000 waiters on one key (goroutines over 50 listen connections)
#                  vs 1 waiter: release-to-grant, one winner per release, server
#                  CPU and statements per release beside the baseline's and the
#                  target's (listen.AwaitAcquire; full: also each waiter with its
#                  own acquire, as before it)
#
#   rollout.log    rolling updates of a 3-replica examples/operator on
#                  the real kube-apiserver: leader changes and leaderless time
#                  per rollout, Lease lock, pg_lease, pg_lease with handover
#   sharded.log    examples/sharded over 3,000 objects (smoke: 60): throughput
#                  at 1-3 replicas, join/leave/crash rebalance times (medians of
#                  5 samples each; smoke: 1), chaos
#
#   e2e.log        (smoke only) firstreconcile, rollout and sharded in one test
#                  binary on one control plane
#
#   firstcalls.log the first inspect, acquire and release on a new connection,
#                  cold and warmed by lease.WarmConn (pkg/lease Go benchmark)
#
# Usage: bench/run.sh [full|smoke|stmtcost]   (smoke: every benchmark, tiny sizes, 6.5 min
# at load 15 with a cached control plane, 3 of them the end-to-end benchmarks;
# stmtcost: pgbench's two ratios and the account only, about 10 min). Benchmarks print numbers; nothing asserts a time.
# Needs: PostgreSQL server binaries + pgbench (apt-get install postgresql),
# Go, and the control plane from hack/build-control-plane.sh (built on first
# use, ~15 min on 2 cores, then cached).
set -euo pipefail
mode="${1:-full}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/go/bin"
out="${BENCH_OUT:-bench/results/$(date -u +%Y%m%dT%H%M%SZ)${mode:+-$mode}}"
mkdir -p "$out"

case "$mode" in
full)
	physical_args=(-samples 5000 -fsync-seconds 2)
	pgbench_args=(-duration 8s -rounds 2 -clients 1,4,16)
	handoff_args=(-trials 60)
	# pkg/elector alone over 200 trials (a p99 needs at least 200), with
	# warm pools (lease.WarmConn) and cold ones, interleaved
	elector_args=(-systems elector,elector-cold -profiles fast -trials 200)
	# the pg_lease handoffs at controller-runtime's timings, 200 trials each
	handoff200_args=(-systems baseline,elector,elector-handover,clientgo-pg,clientgo-pg-handover -profiles defaults -default-trials 200)
	first_reconcile_trials=20
	rollout_env=(PGLEASE_ROLLOUTS=10)
	sharded_env=(PGLEASE_SHARDED_BENCH=1)
	scale_args=(-duration 30s -rounds 2 -keys 1000,10000,100000 -renewals 10000000 -cleanup-keys 100000)
	firstcalls_n=300x
	waiters_args=(-waiters 1000 -conns 50 -pool 50 -releases 30 -each)
	account_args=(-n 2000)
	;;
smoke)
	physical_args=(-samples 200 -fsync-seconds 1)
	pgbench_args=(-duration 1s -rounds 1 -clients 1)
	handoff_args=(-trials 2 -default-trials 1)
	elector_args=()
	handoff200_args=()
	# the e2e benchmarks at their smallest: one trial per lock and cache mode,
	# one rollout per system with short settle times, the sharded run over
	# 60 objects with 5 chaos steps and one sample of each rebalance (about
	# 90 s together, most of smoke's time)
	first_reconcile_trials=1
	rollout_env=(PGLEASE_ROLLOUTS=1 PGLEASE_ROLLOUT_SETTLE=1s)
	sharded_env=(PGLEASE_SHARDED_BENCH=1 PGLEASE_SHARDED_OBJECTS=60 PGLEASE_SHARDED_CHAOS_STEPS=5 PGLEASE_SHARDED_SAMPLES=1)
	scale_args=(-duration 2s -rounds 1 -keys 100,1000 -renewals 20000 -cleanup-keys 2000)
	firstcalls_n=5x
	waiters_args=(-waiters 20 -conns 4 -pool 8 -releases 3 -settle 100ms -also 4x4)
	account_args=(-n 50)
	;;
stmtcost)
	# The statement cost alone: both ratios of pg_lease and of 0.3.0 (in a
	# second database of the same server) beside the bare baselines, at 1 and
	# 16 clients, and the per-statement account of 0.3.0, 0.4.0 and this
	# version (BENCH_STEPS defaults to pgbench,account here).
	pgbench_args=(-duration 8s -rounds 2 -clients 1,16 -variants=false
		-only w1_lease,w1_bare,r_lease,r_bare,r_plupdate,w1_lease@0.3.0,r_lease@0.3.0)
	account_args=(-n 1000)
	physical_args=() handoff_args=() elector_args=() handoff200_args=() scale_args=() waiters_args=()
	first_reconcile_trials=1 firstcalls_n=1x
	rollout_env=() sharded_env=()
	;;
*)
	echo "usage: $0 [full|smoke|stmtcost]" >&2
	exit 2
	;;
esac

pg_bindir="$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
{
	echo "date_utc: $(date -u +%FT%TZ)"
	echo "mode: $mode"
	echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
	echo "postgres: $("$pg_bindir/postgres" --version)"
	echo "pgbench: $( ("$pg_bindir/pgbench" --version || pgbench --version) 2>/dev/null)"
	echo "go: $(go version)"
	echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
	echo "kernel: $(uname -srm)"
	echo "cpu_model: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "cpu_count: $(nproc)"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "load_before: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "storage (tmp dir of the servers):"
	df -hT "${TMPDIR:-/tmp}" | sed 's/^/  /'
	lsblk -d -o NAME,SIZE,ROTA,TYPE,MODEL 2>/dev/null | sed 's/^/  /'
	echo "server settings: fsync, synchronous_commit, shared_buffers, wal_sync_method per mode are in pgbench.json / scale.json / handoff.json (\"server\")"
} | tee "$out/env.txt"

failed=()
# BENCH_STEPS: the steps to run, comma-separated (default: all of them)
all_steps=physical,pgbench,account,handoff,handoff-200,handoff-elector,firstreconcile,rollout,sharded,e2e,firstcalls,scale,waiters
[[ $mode == stmtcost ]] && all_steps=pgbench,account
steps="${BENCH_STEPS:-$all_steps}"
step() {
	local name="$1"
	shift
	case ",$steps," in *",$name,"*) ;; *) return 0 ;; esac
	echo "== $name ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$out/env.txt"
	if ! "$@" 2>&1 | tee "$out/$name.log"; then
		echo "== $name FAILED" | tee -a "$out/env.txt"
		failed+=("$name")
	elif grep -q -- '--- SKIP' "$out/$name.log"; then
		# A skipped benchmark measured nothing: that is a failure here.
		echo "== $name SKIPPED a test (see $out/$name.log)" | tee -a "$out/env.txt"
		failed+=("$name")
	fi
}
step physical go run ./bench/physical -out "$out" "${physical_args[@]}"
step pgbench go run ./bench/pgbench -out "$out" "${pgbench_args[@]}"
# BENCH_ACCOUNT_REV: also account for the current version's install script as
# it was at that git revision (before and after a change, in one run).
if [[ -n ${BENCH_ACCOUNT_REV:-} ]]; then
	rev_script="$(mktemp)"
	trap 'rm -f "$rev_script"' EXIT
	git show "$BENCH_ACCOUNT_REV:sql/pg_lease--$(sed -n "s/^default_version = '\(.*\)'/\1/p" sql/pg_lease.control).sql" >"$rev_script"
	account_args+=(-with "$(sed -n "s/^default_version = '\(.*\)'/\1/p" sql/pg_lease.control)-at-$(git rev-parse --short "$BENCH_ACCOUNT_REV")=$rev_script")
fi
step account go run ./bench/account -out "$out" "${account_args[@]}"
step handoff go run ./bench/handoff -out "$out" "${handoff_args[@]}"
if ((${#handoff200_args[@]})); then
	step handoff-200 go run ./bench/handoff -out "$out/handoff-200" "${handoff200_args[@]}"
fi
if ((${#elector_args[@]})); then
	step handoff-elector go run ./bench/handoff -out "$out/elector-200" "${elector_args[@]}"
fi
first_reconcile_env=(PGLEASE_E2E_FIRST_RECONCILE_TRIALS="$first_reconcile_trials"
	PGLEASE_E2E_RESULTS="$(realpath "$out")/firstreconcile.results")
if [[ $mode == smoke ]]; then
	# The three at once: one test binary (linked once), one control plane.
	step e2e env "${first_reconcile_env[@]}" "${rollout_env[@]}" "${sharded_env[@]}" \
		go test -count=1 -v -timeout 30m -run '^(TestFirstReconcile|TestRollout|TestShardedBenchmark)$' ./test/e2e/
else
	step firstreconcile env "${first_reconcile_env[@]}" go test -count=1 -v -timeout 60m -run '^TestFirstReconcile$' ./test/e2e/
	step rollout env "${rollout_env[@]}" go test -count=1 -v -timeout 60m -run '^TestRollout$' ./test/e2e/
	step sharded env "${sharded_env[@]}" go test -count=1 -v -timeout 60m -run '^TestShardedBenchmark$' ./test/e2e/
fi
step firstcalls go test ./pkg/lease -run '^$' -bench FirstCallsOnANewConnection -benchtime "$firstcalls_n" -count 1
step scale go run ./bench/scale -out "$out" "${scale_args[@]}"
step waiters go run ./bench/waiters -out "$out" "${waiters_args[@]}"
echo "load_after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/env.txt"
echo "results in $out"
if ((${#failed[@]})); then
	echo "failed: ${failed[*]}" >&2
	exit 1
fi
