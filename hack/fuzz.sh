#!/usr/bin/env bash
# Runs every Go fuzz target for DURATION each (default 10m), one at a time,
# one worker each (the machine is shared; each worker starts its own
# throwaway PostgreSQL):
#
#   hack/fuzz.sh [DURATION] [TARGET...]     (TARGET: FuzzClient FuzzSQL FuzzArgs)
#
# `make test` runs it with 15s per target; `make fuzz` with FUZZTIME
# (default 10m). A failing input is written to the package's
# testdata/fuzz/<Target>/ (commit it with the fix: it then runs in every
# `go test`). -fuzzminimizetime is bounded: minimizing a 1 KiB key one SQL
# round trip at a time would otherwise take a minute per new input.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
duration="${1:-10m}"
shift || true
declare -A pkg=([FuzzClient]=./test/fuzz [FuzzSQL]=./test/fuzz [FuzzArgs]=./cmd/pglease)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(FuzzClient FuzzSQL FuzzArgs)
for t in "${targets[@]}"; do
  [ -n "${pkg[$t]:-}" ] || { echo "fuzz.sh: unknown target $t (known: ${!pkg[*]})" >&2; exit 2; }
  echo "== fuzz $t (${pkg[$t]}) for $duration" >&2
  go test -run '^$' -fuzz "^$t\$" -fuzztime "$duration" -fuzzminimizetime 20x -parallel 1 "${pkg[$t]}"
done
