#!/usr/bin/env bash
# `make stress`: each chosen package's tests COUNT times, one process per run,
# while CPU hogs (one `yes` per core) and a `go build -a` loop load the
# machine beside them. Every failed run is reported with its log, which is
# kept (with every other run's) in a folder printed at the start and the end.
#
#   PKGS   packages (go list patterns; default: every package with tests but
#          test/e2e, test/ha and test/pgbouncer, which are long and run alone)
#   COUNT  runs per package (default 5)
#   RUN    only the tests matching this regexp (go test -run)
#   SKIP   not the tests matching this regexp (go test -skip)
#   HOGS   number of CPU hogs (default: one per core; 0 for none)
#   BUILD_LOOP  0 to run without the compile loop (default 1)
#   TIMEOUT     per run (default 15m)
#   OUT    the folder for the logs (default: a new one under TMPDIR)
# Exit status 1 when any run failed. The hogs and the compile loop are
# stopped by their process ids on exit, whatever ends the script.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

count="${COUNT:-5}"
hogs="${HOGS:-$(nproc)}"
timeout="${TIMEOUT:-15m}"
case "$count" in '' | *[!0-9]* | 0) echo "stress: COUNT must be a positive integer, got '$count'" >&2; exit 2 ;; esac
case "$hogs" in '' | *[!0-9]*) echo "stress: HOGS must be a non-negative integer, got '$hogs'" >&2; exit 2 ;; esac

out="${OUT:-}"
if [ -z "$out" ]; then
  out="$(mktemp -d "${TMPDIR:-/tmp}/pglease-stress.XXXXXX")"
else
  mkdir -p "$out"
fi
out="$(cd "$out" && pwd)"

# The packages, as import paths, with test files.
read -r -a patterns <<<"${PKGS:-./...}"
mapfile -t pkgs < <(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "${patterns[@]}")
if [ -z "${PKGS:-}" ]; then
  mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | grep -v -e '/test/e2e ' -e '/test/ha ' -e '/test/pgbouncer ')
fi
if [ ${#pkgs[@]} -eq 0 ]; then
  echo "stress: no package with tests in '${PKGS:-./...}'" >&2
  exit 2
fi

# Load: every pid is recorded and stopped on exit.
load_pids=()
loop_pid=""
stop_load() {
  local p
  for p in "${load_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [ -n "$loop_pid" ]; then
    kill -TERM -- -"$loop_pid" 2>/dev/null || true
    load_pids+=("$loop_pid")
    loop_pid=""
  fi
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  load_pids=()
  rm -rf "$out/.buildloop-cache" "$out/bin"
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The compile loop rebuilds the CLI from scratch (its own build cache) until
# stopped. It runs in a process group of its own, whose id is its pid: stopping
# the group stops the running build and its compilers too.
build_loop='while :; do go build -a -o /dev/null ./cmd/pglease >/dev/null 2>&1 || sleep 1; done'
loop_pid=""

# Compile every test binary first, so that the compile loop is the only
# build beside the runs.
echo "== stress: ${#pkgs[@]} package(s) x $count run(s), $hogs CPU hog(s), compile loop ${BUILD_LOOP:-1}; logs in $out" >&2
bins=()
for line in "${pkgs[@]}"; do
  ip="${line%% *}"
  name="$(echo "${ip#github.com/pglease/pg_lease/}" | tr '/' '_')"
  bin="$out/bin/$name.test"
  mkdir -p "$out/bin"
  if ! go test -c -o "$bin" "$ip" >"$out/$name.build.log" 2>&1; then
    echo "stress: building the tests of $ip failed:" >&2
    cat "$out/$name.build.log" >&2
    exit 1
  fi
  bins+=("$bin")
done

for ((i = 0; i < hogs; i++)); do
  yes >/dev/null &
  load_pids+=($!)
done
if [ "${BUILD_LOOP:-1}" != 0 ]; then
  GOCACHE="$out/.buildloop-cache" setsid bash -c "$build_loop" &
  loop_pid=$!
fi

args=(-test.count=1 -test.v -test.timeout="$timeout")
[ -z "${RUN:-}" ] || args+=(-test.run="$RUN")
[ -z "${SKIP:-}" ] || args+=(-test.skip="$SKIP")

runs=0
failed=()
start=$SECONDS
for idx in "${!pkgs[@]}"; do
  line="${pkgs[$idx]}"
  ip="${line%% *}"
  dir="${line#* }"
  bin="${bins[$idx]}"
  name="$(basename "$bin" .test)"
  for ((n = 1; n <= count; n++)); do
    log="$out/$name.run$n.log"
    t0=$SECONDS
    rc=0
    (cd "$dir" && "$bin" "${args[@]}") >"$log" 2>&1 || rc=$?
    runs=$((runs + 1))
    if [ "$rc" = 0 ]; then
      echo "ok   $ip run $n/$count ($((SECONDS - t0))s)" >&2
    else
      tests="$(grep -E -o -e '^\s*--- FAIL: [^ ]+' -e '^panic: .*' "$log" | sed -E 's/^\s*--- FAIL: //' | sort -u | paste -sd' ' || true)"
      echo "FAIL $ip run $n/$count ($((SECONDS - t0))s, exit $rc): ${tests:-see log} -> $log" >&2
      failed+=("$ip run $n: ${tests:-exit $rc} -> $log")
    fi
  done
done
stop_load

echo >&2
echo "== stress: $runs run(s) of ${#pkgs[@]} package(s) in $((SECONDS - start))s, ${#failed[@]} failed; logs in $out" >&2
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do
    log="${f##*-> }"
    echo >&2
    echo "---- FAIL $f" >&2
    # Each failed test's output (its last 60 lines), then the end of the log.
    for t in $(grep -E -o '^--- FAIL: [^ ]+' "$log" | sed 's/^--- FAIL: //' | sort -u); do
      echo "---- $t" >&2
      awk -v t="$t" '$0 == "=== RUN   " t { on = 1 } on { print } on && index($0, "--- FAIL: " t " ") == 1 { on = 0 }' "$log" |
        tail -n 60 >&2
    done
    echo "---- last lines of $log" >&2
    tail -n 25 "$log" >&2
  done
  exit 1
fi
