#!/usr/bin/env bash
# `make test`: everything, on throwaway servers that this script (or the Go
# test harness) starts and removes.
#   1. installs what is missing (hack/install-deps.sh)
#   2. installs the extension files into the local PostgreSQL (make -C sql install)
#   3. regression + isolation suites against a throwaway cluster
#   4. every Go test (unit, integration, failure suite, end-to-end), each
#      package starting its own throwaway servers (the Patroni suite,
#      test/ha, is make test-ha: CI runs it after this)
#   5. a short run of every fuzz target (FUZZTIME each, default 15s; the
#      long run is `make fuzz`)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

hack/install-deps.sh

echo "== extension: make install" >&2
make -s -C sql install >/dev/null

echo "== SQL regression and isolation suites" >&2
if ! hack/with-postgres.sh -- make -s -C sql installcheck; then
  for f in sql/regression.diffs sql/output_iso/regression.diffs; do
    [ -f "$f" ] && { echo "--- $f" >&2; head -c 20000 "$f" >&2; }
  done
  exit 1
fi

echo "== test control plane (etcd + kube-apiserver; built once per machine, ~10-15 min cold)" >&2
export PGLEASE_CACHE="${PGLEASE_CACHE:-$( [ "$(id -u)" = 0 ] && echo /var/cache/pg_lease || echo "$HOME/.cache/pg_lease")}"
bash hack/build-control-plane.sh >/dev/null

echo "== Go tests" >&2
go vet ./...
# The end-to-end suite (3 operator processes per scenario on a real
# kube-apiserver) runs alone after the rest, so that its timing-sensitive
# properties (a cut-off leader stops before its server-side expiry) are not
# measured on a machine saturated by the other packages' tests.
go test -count=1 -timeout 25m ${GOTESTFLAGS:-} $(go list ./... | grep -v -e '/test/e2e$' -e '/test/ha$' -e '/test/pgbouncer$')
go test -count=1 -timeout 15m ${GOTESTFLAGS:-} ./test/e2e/
# The suite behind PgBouncer runs alone too: Debian's PgBouncer 1.18 can
# exit on a cancel request (docs/operations.md), more often on a saturated machine.
go test -count=1 -timeout 15m ${GOTESTFLAGS:-} ./test/pgbouncer/

echo "== fuzzing: ${FUZZTIME:-15s} per target (make fuzz runs them longer)" >&2
hack/fuzz.sh "${FUZZTIME:-15s}"
