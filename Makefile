# pg_lease: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
# Cache of fetched PostgreSQL majors and the built test control plane. As root
# the servers run as "nobody", which cannot enter /root: cache outside it.
export PGLEASE_CACHE ?= $(if $(filter 0,$(shell id -u)),/var/cache/pg_lease,$(HOME)/.cache/pg_lease)

.PHONY: all build test model stress test-ha test-matrix install installcheck demo robustness robustness-hostile bench bench-smoke defects fuzz mutate fmt vet

all: build

## build: every command into bin/ (pglease, ...)
build:
	go build -o bin/ ./cmd/...

## test: install what is missing, then run every suite on throwaway servers
test:
	hack/test.sh

## model: the Quint model of the protocol (specs/model) at length: MAX_SAMPLES (default 300) random runs
## of MAX_STEPS (25) steps from SEED on every invariant, and each case with and without its guard;
## make test runs 30 runs and the cases with their guards; test/model replays traces against the SQL
model:
	SEED=$(or $(SEED),20261207) MAX_SAMPLES=$(or $(MAX_SAMPLES),300) MAX_STEPS=$(or $(MAX_STEPS),25) GUARDS=1 hack/model.sh

## stress: each package's tests COUNT times (default 5) beside CPU hogs (one per core) and a compile
## loop; PKGS="./pkg/lease/ ./pkg/elector/" RUN=regexp SKIP=regexp; every failure with its log.
## Installs first what make test installs (packages, the extension, the control plane, the model tool)
stress:
	hack/install-deps.sh
	$(MAKE) -s -C sql install >/dev/null
	bash hack/build-control-plane.sh >/dev/null
	hack/model.sh --install
	hack/stress.sh

## test-ha: pg_lease under Patroni (etcd, three PostgreSQL 15 nodes; asynchronous, synchronous and strict
## synchronous): switchovers, crashes, frozen primaries, etcd lost, Patroni killed, a switchover mid-commit;
## prints the leaderless time and safety counts per mode and fault (test/ha)
test-ha:
	hack/install-deps.sh
	$(MAKE) -s -C sql install >/dev/null
	bash hack/build-control-plane.sh >/dev/null
	hack/test-ha.sh

## install: copy the extension into the local PostgreSQL (needs root or write access)
install:
	$(MAKE) -C sql install

## installcheck: regression + isolation suites on a throwaway cluster
installcheck: install
	hack/with-postgres.sh -- $(MAKE) -C sql installcheck

## demo: three candidates elect a leader through pg_lease on a throwaway PostgreSQL;
## kill, takeover, freeze, and a stale write rejected by the fencing guard
demo:
	hack/install-deps.sh
	$(MAKE) -s -C sql install >/dev/null
	go run ./cmd/pglease-demo

## test-matrix: every suite on PostgreSQL 14-18 (MAJORS="15 17" for a subset; MATRIX_FLAGS, see
## hack/test-matrix.sh); summary table
test-matrix:
	hack/install-deps.sh
	hack/test-matrix.sh $(MATRIX_FLAGS) $(MAJORS)

## robustness-hostile: honest electors, client-go locks, a sharded controller, handovers and free-key
## probes, each as a role of its own, while hostile roles attack at random; checks that no honest
## outcome changes (docs/robustness.md); DURATION=2m SEED=0 (0: from the clock)
robustness-hostile:
	hack/install-deps.sh
	go run ./cmd/pglease-robustness -hostile -duration $(or $(DURATION),2m) -seed $(or $(SEED),0)

## bench: every benchmark (pgbench W1/W2/R vs bare SQL, handoff/takeover, first reconcile, scale, clean-up), ~65 min;
## results in bench/results/<UTC timestamp>-full/ (docs/benchmarks.md)
bench:
	hack/install-deps.sh
	bench/run.sh full

## bench-smoke: every benchmark at tiny sizes (6.5 min at load 15): proves they still run, numbers mean nothing
bench-smoke:
	hack/install-deps.sh
	bench/run.sh smoke

## defects: six deliberate SQL defects, each through the four suites (docs/audit/defects.md); ~15 min
defects:
	hack/install-deps.sh
	hack/defects.sh

## fuzz: every Go fuzz target (SQL API through pkg/lease, raw SQL with NULLs, the CLI's arguments),
## FUZZTIME each (default 10m), one worker each; a failing input lands in testdata/fuzz/
fuzz:
	hack/install-deps.sh
	hack/fuzz.sh $(or $(FUZZTIME),10m)

## mutate: mutation testing of the SQL: every small mutant of the installed scripts through the
## regression, isolation, fuzz-package and upgrade suites (docs/audit/defects.md); MUTATE_ARGS="--max 60 --seed 1" to sample
mutate:
	hack/install-deps.sh
	hack/mutate.py $(MUTATE_ARGS)

## robustness: random operations under random faults (server kill, connection cuts,
## frozen clients, clock jumps), history checked; DURATION=5m SEED=0 (0: from the clock)
robustness:
	hack/install-deps.sh
	go run ./cmd/pglease-robustness -duration $(or $(DURATION),5m) -seed $(or $(SEED),0) -clients 8 -procs 4 -keys 3 -faults kill,proxy,stop,clock -out $(or $(OUT),robustness-history.json)

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	go vet ./...
