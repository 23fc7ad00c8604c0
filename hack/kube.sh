#!/usr/bin/env bash
# Builds the node and controller binaries of Portico's real-cluster lab (test/cluster):
# kubelet, kube-proxy, kube-controller-manager and kube-scheduler, from the Go module proxy only (the
# wrapper module kube/ beside this script, as test/kapi does for kube-apiserver), and
# caches them by version:
#
#   ${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/cluster}/k8s-<ver>/{kubelet,kube-proxy,kube-controller-manager,kube-scheduler}
#
# The version is the one kube/go.mod beside this script requires (k8s.io/kubernetes); test/cluster (the Go
# package) looks in the same folder. kube-apiserver, etcd and kubectl come from
# hack/kapi.sh (make kapi). Idempotent: when the binaries are cached it only checks
# their stamps. Cold on 2 cores shared with other builds, after make kapi (whose packages
# come from the Go build cache), in this order: kube-scheduler ~2 min,
# kube-controller-manager ~4 min, kubelet ~1.5 min, kube-proxy ~1 min; ~8.5 min in all,
# ~0.05 s cached.
#
#   kube.sh          build what is missing, print the folder
#   kube.sh dir      print the folder only
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
# Same settings as hack/kapi.sh (cgo as the machine has it, -trimpath): the
# packages kube-apiserver shares with these are taken from the Go build cache.

log() { echo "cluster: $*" >&2; }

kv=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/kube/go.mod")
[ -n "$kv" ] || { log "cannot read the k8s.io/kubernetes version from kube/go.mod"; exit 1; }
cache=${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/cluster}
dir=$cache/k8s-$kv

if [ "${1:-}" = dir ]; then echo "$dir"; exit 0; fi

minor=$(echo "$kv" | cut -d. -f2)
ld="-s -w"
# Without these the binaries report v0.0.0: the kubelet registers its node with that
# version and the API server's clients get confused.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$kv -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
mkdir -p "$dir"
for name in kube-scheduler kube-controller-manager kubelet kube-proxy; do
  if [ -x "$dir/$name" ] && [ "$(cat "$dir/.$name.version" 2>/dev/null)" = "$kv" ]; then
    continue
  fi
  t0=$SECONDS
  log "building $name $kv (the four take ~8.5 min cold on 2 cores)"
  (cd "$here/kube" && nice -n 10 go build -trimpath -ldflags "$ld" -o "$dir/.$name.tmp" "./$name")
  mv -f "$dir/.$name.tmp" "$dir/$name"
  echo "$kv" >"$dir/.$name.version"
  log "built $name in $((SECONDS - t0)) s"
done
echo "$dir"
