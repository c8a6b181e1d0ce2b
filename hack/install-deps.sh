#!/usr/bin/env bash
# Installs what the tests, the demo and the benchmarks need on a Debian
# machine, or stops with a message naming exactly what is missing.
#   - PostgreSQL 15 server and client (postgresql-15, postgresql-client-15:
#     server binaries, psql, pg_regress, the isolation tester, PGXS)
#   - libfaketime (faketime), for the clock-jump failure tests
#   - make, setpriv (util-linux)
#   - pgbouncer (Debian's PgBouncer), for the tests behind a pooler
#   - promtool (Debian's prometheus package), for the alert rules' and the
#     dashboard's tests
#   - patroni (Debian 12: 3.0.x), the HA manager of make test-ha
#   - node and npm (PostgreSQL 14, 16, 17, 18 and the Quint model checker of
#     specs/model come from the npm registry)
# Go (>= 1.26) must already be on PATH; it is not installed here.
set -euo pipefail

need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
[ -x /usr/lib/postgresql/15/lib/pgxs/src/test/isolation/pg_isolation_regress ] || need+=(postgresql-client-15)
command -v pg_config >/dev/null || need+=(postgresql-common)
ls /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || need+=(faketime)
command -v make >/dev/null || need+=(make)
command -v setpriv >/dev/null || need+=(util-linux)
command -v pgbench >/dev/null || need+=(postgresql-contrib)
command -v promtool >/dev/null || need+=(prometheus)
command -v patroni >/dev/null && command -v patronictl >/dev/null || need+=(patroni)
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
# node and npm fetch the other PostgreSQL majors for make test-matrix and the
# model checker (hack/model.sh)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-deps: missing Debian packages: ${need[*]}" >&2
    echo "install them with: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then
    echo "install-deps: Go is at /usr/local/go/bin but not on PATH: export PATH=\$PATH:/usr/local/go/bin" >&2
  else
    echo "install-deps: Go >= 1.26 is needed (https://go.dev/dl); it is not installed here" >&2
  fi
  exit 1
fi
