#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd that Portico's integration tests run against,
# from the Go module proxy only, and caches them by version:
#
#   ${PORTICO_KAPI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/kapi}/k8s-<ver>-etcd-<ver>/{kube-apiserver,etcd,kubectl}
#
# The versions are the ones the wrapper modules in kapi/ beside this script require
# (kube-apiserver/go.mod: k8s.io/kubernetes, etcd/go.mod: go.etcd.io/etcd/server/v3);
# test/kapi (the Go package) looks in the same folder. Idempotent: when both binaries are
# cached, it only checks a stamp (~0.1 s). A cold build takes ~4 min on 2 cores and
# ~1.9 GB of RAM for kube-apiserver, ~25 s for etcd.
#
#   kapi.sh          build what is missing, print the folder
#   kapi.sh dir      print the folder only
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

log() { echo "kapi: $*" >&2; }

modver() { # go.mod module -> version
  awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1"
}

kv=$(modver "$here/kapi/kube-apiserver/go.mod" k8s.io/kubernetes)
ev=$(modver "$here/kapi/etcd/go.mod" go.etcd.io/etcd/server/v3)
[ -n "$kv" ] && [ -n "$ev" ] || { log "cannot read the versions from the wrapper go.mod files"; exit 1; }
cache=${PORTICO_KAPI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/kapi}
dir=$cache/k8s-$kv-etcd-$ev

if [ "${1:-}" = dir ]; then echo "$dir"; exit 0; fi

stamp() { # name version: is the cached binary the one for this version?
  [ -x "$dir/$1" ] && [ "$(cat "$dir/.$1.version" 2>/dev/null)" = "$2" ]
}

build() { # name srcdir ldflags version
  local name=$1 src=$2 ld=$3 ver=$4 t0=$SECONDS
  log "building $name $ver (cold: ~4 min for kube-apiserver, ~25 s for etcd on 2 cores)"
  mkdir -p "$dir"
  (cd "$src" && nice go build -trimpath -ldflags "$ld" -o "$dir/.$name.tmp" .)
  mv -f "$dir/.$name.tmp" "$dir/$name"
  echo "$ver" >"$dir/.$name.version"
  log "built $name in $((SECONDS - t0)) s"
}

minor=$(echo "$kv" | cut -d. -f2)
ld="-s -w"
# Without these the binaries report v0.0.0 and clients' discovery gets confused.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$kv -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
if ! stamp kube-apiserver "$kv"; then
  build kube-apiserver "$here/kapi/kube-apiserver" "$ld" "$kv"
fi
if ! stamp etcd "$ev"; then
  build etcd "$here/kapi/etcd" "-s -w" "$ev"
fi
# kubectl (k8s.io/kubectl at the staging version matching kube-apiserver): the lab
# and `make demo` show `kubectl get ingress` with it (~25 s cold).
cv=$(modver "$here/kapi/kubectl/go.mod" k8s.io/kubectl)
if ! stamp kubectl "$cv"; then
  build kubectl "$here/kapi/kubectl" "$ld" "$cv"
fi
echo "$dir"
