#!/usr/bin/env bash
# Builds a test control plane (etcd + kube-apiserver) from the Go module proxy
# alone, using the helper module in hack/controlplane, into a cache folder keyed
# by version:
#
#   ${PGLEASE_CACHE:-$HOME/.cache/pg_lease}/controlplane/<k8s-version>_<etcd-version>/
#       etcd  kube-apiserver  .stamp
#
# That folder is laid out as controller-runtime's envtest expects for
# KUBEBUILDER_ASSETS / BinaryAssetsDirectory.
#
# Prints ONLY that folder on stdout; progress goes to stderr. Idempotent: when
# both binaries exist and the stamp (a hash of the helper module's go.mod and
# go.sum, this script and the Go version) matches, nothing is built. A cold
# build takes about a quarter of an hour on 2 cores and about 2.5 GB of memory.
# Concurrent callers are serialised with flock(1) on a lock file beside the
# folder.
set -euo pipefail

log() { printf 'build-control-plane: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

script_path="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
mod_dir="$(dirname "$script_path")/controlplane"
[[ -f "$mod_dir/go.mod" && -f "$mod_dir/go.sum" ]] || die "helper module not found at $mod_dir"
command -v go >/dev/null 2>&1 || die "go is not on PATH"

# Versions come straight from the helper module's go.mod (the require block).
mod_version() {
	awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$mod_dir/go.mod"
}
k8s_version="$(mod_version k8s.io/kubernetes)"
etcd_version="$(mod_version go.etcd.io/etcd/server/v3)"
[[ -n "$k8s_version" ]] || die "k8s.io/kubernetes is not required in $mod_dir/go.mod"
[[ -n "$etcd_version" ]] || die "go.etcd.io/etcd/server/v3 is not required in $mod_dir/go.mod"

cache_root="${PGLEASE_CACHE:-${HOME:?HOME is not set}/.cache/pg_lease}/controlplane"
out_dir="$cache_root/${k8s_version}_${etcd_version}"

go_version="$(GOTOOLCHAIN=local go env GOVERSION)"
stamp="$(cat "$mod_dir/go.mod" "$mod_dir/go.sum" "$script_path" <(printf '%s\n' "$go_version") |
	sha256sum | awk '{print $1}')"

is_fresh() {
	[[ -x "$out_dir/etcd" && -x "$out_dir/kube-apiserver" && -f "$out_dir/.stamp" ]] &&
		[[ "$(cat "$out_dir/.stamp")" == "$stamp" ]]
}

if is_fresh; then
	printf '%s\n' "$out_dir"
	exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.${k8s_version}_${etcd_version}.lock"
if ! flock -n 9; then
	log "another build of $out_dir is running; waiting for it"
	flock 9
fi
# Someone else may have finished the build while we waited.
if is_fresh; then
	printf '%s\n' "$out_dir"
	exit 0
fi

# Pin the Kubernetes version the server reports (otherwise v0.0.0-master).
# The build date is the release's publication time from the module proxy, so
# that the same inputs give the same binary.
k8s_major="${k8s_version#v}"
k8s_major="${k8s_major%%.*}"
k8s_minor="${k8s_version#v*.}"
k8s_minor="${k8s_minor%%.*}"

# -mod=readonly: the committed go.mod/go.sum are complete and must not change;
# -buildvcs=false: the binaries must not depend on the project's own commit.
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
build_date="$(cd "$mod_dir" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
build_date="${build_date:-1970-01-01T00:00:00Z}"
vpkg=k8s.io/component-base/version
ldflags="-s -w"
ldflags+=" -X $vpkg.gitVersion=$k8s_version"
ldflags+=" -X $vpkg.gitMajor=$k8s_major"
ldflags+=" -X $vpkg.gitMinor=$k8s_minor"
ldflags+=" -X $vpkg.gitTreeState=clean"
ldflags+=" -X $vpkg.buildDate=$build_date"
ldflags+=" -X $vpkg.gitCommit="

tmp_dir="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp_dir"' EXIT

log "building etcd $etcd_version and kube-apiserver $k8s_version ($go_version) into $out_dir"
log "a cold build takes about 15 minutes on 2 cores"
start=$SECONDS
(
	cd "$mod_dir"
	log "building etcd"
	go build -p 2 -trimpath -ldflags "-s -w" -o "$tmp_dir/etcd" ./cmd/etcd 1>&2
	log "building kube-apiserver"
	go build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp_dir/kube-apiserver" ./cmd/kube-apiserver 1>&2
)

reported="$("$tmp_dir/kube-apiserver" --version 2>&1 || true)"
[[ "$reported" == "Kubernetes $k8s_version" ]] ||
	die "built kube-apiserver reports '$reported', want 'Kubernetes $k8s_version'"

mkdir -p "$out_dir"
rm -f "$out_dir/.stamp"
mv -f "$tmp_dir/etcd" "$out_dir/etcd"
mv -f "$tmp_dir/kube-apiserver" "$out_dir/kube-apiserver"
printf '%s\n' "$stamp" >"$out_dir/.stamp"
log "built in $((SECONDS - start))s"
printf '%s\n' "$out_dir"
