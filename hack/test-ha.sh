#!/usr/bin/env bash
# `make test-ha`: pg_lease under Patroni (test/ha). Patroni with etcd and
# three PostgreSQL nodes on loopback, in asynchronous, synchronous and strict
# synchronous mode; electors on a multi-host DSN; switchovers, crashes,
# frozen primaries, failovers back and forth, and faults of Patroni itself:
# etcd lost during a failover, Patroni killed on the primary, a switchover
# while commits are in flight. Prints, per mode and fault kind, the time
# from Patroni's promotion to the next leader's first fenced write and the
# safety counts. Expects what `make test-ha` installs first (Patroni, the
# extension files, the test control plane's etcd). The PostgreSQL binaries
# are $PGLEASE_PG_BINDIR's when set (the extension must be installed there).
#   PGLEASE_HA_MODES=strict      a subset of the modes (async,sync,strict)
#   PGLEASE_HA_FAULTS=crash,...  a subset of the fault kinds (test/ha/README.md)
#   PGLEASE_HA_ROUNDS=N          every fault kind N times in every mode
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

log="$(mktemp "${TMPDIR:-/tmp}/pglease-test-ha.XXXXXX")"
status=0
go test -count=1 -v -run '^TestPatroni$' -timeout 30m ./test/ha/ >"$log" 2>&1 || status=$?
if [ "$status" != 0 ]; then
  tail -c 60000 "$log" >&2
  echo "test-ha: FAILED (status $status); the whole output is in $log" >&2
  exit "$status"
fi
trap 'rm -f "$log"' EXIT
grep -E '^\s+(ha_test|check_test)\.go' "$log" | grep -v -E 'leaderless after failover|after promotion:' >&2 || true
grep -E '^(leaderless after failover|  after promotion):' "$log"
