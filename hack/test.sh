#!/usr/bin/env bash
# `make test`: everything, on throwaway servers that this script (or the Go
# test harness) starts and removes.
#   1. installs what is missing (hack/install-deps.sh)
#   2. installs the extension files into the local PostgreSQL (make -C sql install)
#   3. regression + isolation suites against a throwaway cluster (meanwhile,
#      on a new machine, the test control plane builds at low priority)
#   4. every Go test (unit, integration, failure suite, end-to-end), each
#      package starting its own throwaway servers (the Patroni suite,
#      test/ha, is make test-ha: CI runs it after this)
#   5. a short run of every fuzz target (FUZZTIME each, default 15s; the
#      long run is `make fuzz`)
# Before the Go tests, the Quint model of the protocol (specs/model; its tool
# installed from the npm registry by its lock file) is simulated briefly and
# its cases run (hack/model.sh; `make model` runs it at length); the Go test
# test/model replays its traces against the SQL.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

hack/install-deps.sh

# The test control plane (etcd + kube-apiserver) is built once per machine,
# about 15 min on 2 cores. On a new machine it builds at the lowest priority
# beside the suites that do not need it; the packages that need it run after.
# When it is cached, the build step returns at once.
export PGLEASE_CACHE="${PGLEASE_CACHE:-$( [ "$(id -u)" = 0 ] && echo /var/cache/pg_lease || echo "$HOME/.cache/pg_lease")}"
cp_log="$(mktemp "${TMPDIR:-/tmp}/pglease-control-plane.XXXXXX")"
setsid -w nice -n 19 bash hack/build-control-plane.sh >"$cp_log" 2>&1 &
cp_pid=$!
# Its own process group: stopped with the go builds under it if this fails.
trap '[ -z "$cp_pid" ] || kill -- -"$cp_pid" 2>/dev/null; rm -f "$cp_log"' EXIT

echo "== extension: make install" >&2
make -s -C sql install >/dev/null

echo "== SQL regression and isolation suites" >&2
if ! hack/with-postgres.sh -- make -s -C sql installcheck; then
  for f in sql/regression.diffs sql/output_iso/regression.diffs; do
    [ -f "$f" ] && { echo "--- $f" >&2; head -c 20000 "$f" >&2; }
  done
  exit 1
fi

# wait_control_plane: the build's result; its log on failure.
wait_control_plane() {
  local rc=0
  wait "$cp_pid" || rc=$?
  cp_pid=
  if [ "$rc" != 0 ]; then
    cat "$cp_log" >&2
    echo "test: building the test control plane failed (hack/build-control-plane.sh)" >&2
    exit 1
  fi
}
# examples/manager and internal/kubetest need the control plane: with the
# others when it is built, after them while it is still building.
late=()
skip=(-e '/test/e2e$' -e '/test/ha$' -e '/test/pgbouncer$')
if kill -0 "$cp_pid" 2>/dev/null; then
  echo "== test control plane (etcd + kube-apiserver): building at low priority beside the tests (~15 min on 2 cores)" >&2
  late=(./examples/manager/ ./internal/kubetest/)
  skip+=(-e '/examples/manager$' -e '/internal/kubetest$')
else
  wait_control_plane
fi

echo "== the model (specs/model)" >&2
hack/model.sh

echo "== Go tests" >&2
go vet ./...
# The end-to-end suite (3 operator processes per scenario on a real
# kube-apiserver) runs alone after the rest, so that its timing-sensitive
# properties (a cut-off leader stops before its server-side expiry) are not
# measured on a machine saturated by the other packages' tests.
go test -count=1 -timeout 25m ${GOTESTFLAGS:-} $(go list ./... | grep -v "${skip[@]}")
if [ ${#late[@]} -gt 0 ]; then
  echo "== waiting for the test control plane build" >&2
  wait_control_plane
  go test -count=1 -timeout 15m ${GOTESTFLAGS:-} "${late[@]}"
fi
go test -count=1 -timeout 15m ${GOTESTFLAGS:-} ./test/e2e/
# The suite behind PgBouncer runs alone too: Debian's PgBouncer 1.18 can
# exit on a cancel request (docs/operations.md), more often on a saturated machine.
go test -count=1 -timeout 15m ${GOTESTFLAGS:-} ./test/pgbouncer/

echo "== fuzzing: ${FUZZTIME:-15s} per target (make fuzz runs them longer)" >&2
hack/fuzz.sh "${FUZZTIME:-15s}"
