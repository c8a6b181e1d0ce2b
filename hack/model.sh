#!/usr/bin/env bash
# The Quint model of the protocol (specs/model): installs the tool from the
# npm registry with its pinned lock file (npm ci into specs/model/node_modules,
# once per lock file), then
#   1. simulates the model with every guard and assumption, checking each
#      invariant on MAX_SAMPLES random runs of MAX_STEPS steps from SEED;
#   2. runs the cases (traces.md): each holds in the model (module main), and,
#      with GUARDS=1, breaks its invariant with its guard removed (modules
#      no_* of guards.qnt; each module costs a few seconds of start-up).
# The replay of the model's traces against the SQL is the Go test test/model.
#   hack/model.sh            (make test: SEED=20261207 MAX_SAMPLES=30 MAX_STEPS=20)
#   make model               (CI: MAX_SAMPLES=300 MAX_STEPS=25 GUARDS=1)
#   hack/model.sh --install  (installs the tool only: make stress, for test/model)
# Environment: SEED, MAX_SAMPLES, MAX_STEPS, GUARDS.
set -euo pipefail
cd "$(dirname "$0")/../specs/model"

seed="${SEED:-20261207}"
samples="${MAX_SAMPLES:-30}"
steps="${MAX_STEPS:-20}"

command -v node >/dev/null && command -v npm >/dev/null || {
	echo "model: node and npm are needed (hack/install-deps.sh installs them)" >&2
	exit 1
}
# npm ci once per lock file (node_modules/.lock-sum names the one installed)
sum="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat node_modules/.lock-sum 2>/dev/null)" != "$sum" ]; then
	echo "model: npm ci (specs/model)" >&2
	npm ci --no-audit --no-fund --loglevel=error >&2
	echo "$sum" >node_modules/.lock-sum
fi
[ "${1:-}" = --install ] && exit 0
quint=(node node_modules/@informalsystems/quint/dist/src/cli.js)

echo "model: simulating, seed $seed, $samples runs of $steps steps" >&2
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if ! "${quint[@]}" run main.qnt --backend=typescript --main=main --seed="$seed" --max-samples="$samples" \
	--max-steps="$steps" --invariants noEpochTwice oneBeliever handoverToActable freeKeyGranted >"$out" 2>&1; then
	tail -c 20000 "$out" >&2
	echo "model: the simulation failed; its trace: (cd specs/model && npx quint run main.qnt --backend=typescript --main=main --seed=$seed --max-samples=$samples --max-steps=$steps --invariants noEpochTwice oneBeliever handoverToActable freeKeyGranted --verbosity=3)" >&2
	exit 1
fi
modules=(main:main.qnt)
if [ "${GUARDS:-0}" = 1 ]; then
	modules+=(no_ttlRecheck:guards.qnt no_graceSaysEnd:guards.qnt no_restartBase:guards.qnt
		no_handoverRole:guards.qnt no_configureRecords:guards.qnt)
	echo "model: the cases, with every guard and with each guard removed" >&2
else
	echo "model: the cases (GUARDS=1: also with each guard removed)" >&2
fi
for m in "${modules[@]}"; do
	if ! "${quint[@]}" test "${m#*:}" --backend=typescript --main="${m%%:*}" --match=case --seed=1 --max-samples=1 >"$out" 2>&1; then
		tail -c 20000 "$out" >&2
		echo "model: a case failed in module ${m%%:*}" >&2
		exit 1
	fi
done
echo "model: ok" >&2
