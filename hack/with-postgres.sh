#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL cluster, then removes it.
#
#   hack/with-postgres.sh [--bindir DIR] [--set NAME=VALUE]... -- COMMAND [ARG]...
#
# The cluster lives in a temporary directory, listens only on a private Unix
# socket directory (no TCP), trusts local connections, and runs as user
# "nobody" when this script runs as root (the postmaster refuses root). The
# postmaster is this script's own child, waited on at exit, so it never
# lingers as a zombie. COMMAND runs with PGHOST, PGPORT, PGUSER=postgres and
# PGDATABASE=postgres exported, and PGLEASE_PG_BINDIR set to the binaries used.
# The script exits with COMMAND's status.
set -euo pipefail

bindir="${PGLEASE_PG_BINDIR:-}"
settings=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bindir) bindir="$2"; shift 2 ;;
    --set) settings+=("-c" "$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "with-postgres.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--bindir DIR] [--set NAME=VALUE]... -- COMMAND..." >&2; exit 2; }

if [ -z "$bindir" ]; then
  if command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/postgres" ]; then
    bindir="$(pg_config --bindir)"
  else
    bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  fi
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/postgres" ] || [ ! -x "$bindir/initdb" ]; then
  echo "with-postgres.sh: no PostgreSQL server binaries found (looked at PGLEASE_PG_BINDIR, pg_config --bindir, /usr/lib/postgresql/*/bin)." >&2
  echo "Install them: apt-get install postgresql-15   (or set PGLEASE_PG_BINDIR)" >&2
  exit 1
fi

run_as=()
if [ "$(id -u)" = 0 ]; then
  run_as=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi

tmp="$(mktemp -d /tmp/pglease-cluster.XXXXXX)"
chmod 755 "$tmp"
mkdir "$tmp/data" "$tmp/sock"
[ "$(id -u)" = 0 ] && chown nobody:nogroup "$tmp/data" "$tmp/sock"
pid=""

cleanup() {
  local rc=$?
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT INT TERM

"${run_as[@]}" "$bindir/initdb" -D "$tmp/data" -U postgres -A trust -E UTF8 --locale=C >"$tmp/initdb.log" 2>&1 \
  || { cat "$tmp/initdb.log" >&2; exit 1; }

port=$(( 20000 + RANDOM % 20000 ))
"${run_as[@]}" "$bindir/postgres" -D "$tmp/data" -k "$tmp/sock" -p "$port" \
  -c listen_addresses='' -c fsync=off -c max_connections=60 \
  -c log_min_messages=warning "${settings[@]}" >"$tmp/server.log" 2>&1 &
pid=$!

for _ in $(seq 1 100); do
  if "$bindir/pg_isready" -q -h "$tmp/sock" -p "$port" -U postgres 2>/dev/null; then break; fi
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
  sleep 0.1
done
"$bindir/pg_isready" -q -h "$tmp/sock" -p "$port" -U postgres || { cat "$tmp/server.log" >&2; exit 1; }

export PGHOST="$tmp/sock" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres PGLEASE_PG_BINDIR="$bindir"
set +e
"$@"
rc=$?
set -e
if [ $rc -ne 0 ] && [ -s "$tmp/server.log" ]; then
  echo "--- server log (last 30 lines) ---" >&2
  tail -n 30 "$tmp/server.log" >&2
fi
exit $rc
