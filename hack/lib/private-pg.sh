# Sourced by hack/defects.sh and sql/test/prove-breaks.sh:
#   private_pg NAME SQLDIR
# copies pg_config's PostgreSQL installation (bin, lib, share) into a fresh
# scratch directory, so that extension files written there never touch a
# shared one, and a copy of SQLDIR's Makefile, scripts and tests into
# $scratch/work (suite results never collide with a working tree). Sets
# scratch, sbin (the copy's bindir), extdir (its extension directory) and
# work; removes the scratch directory on exit.
private_pg() {
	local name="$1" sqldir="$2" pgbin pgroot pgshare
	pgbin="$(pg_config --bindir)"     # e.g. /usr/lib/postgresql/15/bin
	pgroot="$(dirname "$pgbin")"      # /usr/lib/postgresql/15
	pgshare="$(pg_config --sharedir)" # /usr/share/postgresql/15
	scratch="$(mktemp -d "/tmp/pg_lease-$name.XXXXXX")"
	trap 'rm -rf "$scratch"' EXIT
	mkdir -p "$scratch/lib/postgresql" "$scratch/share/postgresql"
	cp -a "$pgroot" "$scratch/lib/postgresql/"
	cp -a "$pgshare" "$scratch/share/postgresql/"
	chmod -R a+rX "$scratch"
	sbin="$scratch/lib/postgresql/$(basename "$pgroot")/bin"
	extdir="$("$sbin/pg_config" --sharedir)/extension"
	case "$extdir" in "$scratch"/*) ;; *) echo "$name: $extdir is not inside the scratch copy" >&2; exit 2 ;; esac
	work="$scratch/work"
	mkdir -p "$work"
	cp -a "$sqldir"/Makefile "$sqldir"/pg_lease.control "$sqldir"/pg_lease--*.sql "$sqldir"/test "$work/"
}
