#!/usr/bin/env bash
# Builds the backends of the Gateway API conformance suite, echo-basic and CoreDNS,
# and the suite itself (its own test, compiled unmodified with go test -c), from
# the Go module proxy only, and caches them by version:
#
#   ${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/cluster}/gateway-api-<ver>/echo-basic
#   ${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/cluster}/coredns-<ver>/coredns
#   ${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/cluster}/gateway-api-<ver>/conformance.test
#
# The versions are the ones the wrapper modules beside this script require
# (conformance/echo-basic/go.mod: tool sigs.k8s.io/gateway-api/conformance/echo-basic;
# conformance/coredns/go.mod: tool github.com/coredns/coredns), each its own module
# so that neither pulls the other's dependencies, nor the main module's. The test
# cluster has no registry: test/cluster (BuildConformanceImages) packs the binaries
# as the images the suite's manifests name. Built as echo-basic's own image is
# (CoreDNS's release differs only in stamping its git commit): static (CGO off),
# -trimpath, no build ID, so the same sources give the same bytes.
# Idempotent: when both are cached, only their stamps (the version and a digest of the
# wrapper's go.sum) are checked (~0.04 s). Cold, modules already downloaded (~30 s
# more to download CoreDNS's), measured on 2 cores shared with other tests (load ~13):
# echo-basic 37 s, CoreDNS 356 s.
#
#   conformance.sh          build what is missing, print the three binaries' paths
#                           (echo-basic's, CoreDNS's, the suite's), one a line
#   conformance.sh path     print the paths only
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export CGO_ENABLED=0

log() { echo "conformance: $*" >&2; }

# version MODULE WRAPPER: the version of MODULE that the wrapper module requires.
version() {
  awk -v m="$1" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$here/conformance/$2/go.mod"
}
gv=$(version sigs.k8s.io/gateway-api/conformance echo-basic)
cv=$(version github.com/coredns/coredns coredns)
[ -n "$gv" ] && [ -n "$cv" ] || { log "cannot read the versions from conformance/*/go.mod"; exit 1; }
cache=${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/cluster}

# wrapper   package                                          version  binary (in <folder>-<version>)
# (the suite: its own test, compiled with go test -c, from hack/conformance/suite)
builds="echo-basic sigs.k8s.io/gateway-api/conformance/echo-basic gateway-api $gv echo-basic
coredns    github.com/coredns/coredns                       coredns $cv coredns
suite      sigs.k8s.io/gateway-api/conformance              gateway-api $gv conformance.test"

paths() {
  echo "$builds" | while read -r _ _ folder ver name; do echo "$cache/$folder-$ver/$name"; done
}

if [ "${1:-}" = path ]; then paths; exit 0; fi

echo "$builds" | while read -r wrapper pkg folder ver name; do
  dir=$cache/$folder-$ver
  stamp="$ver $(sha256sum <"$here/conformance/$wrapper/go.sum" | cut -c1-16)"
  if [ -x "$dir/$name" ] && [ "$(cat "$dir/.$name.version" 2>/dev/null)" = "$stamp" ]; then
    continue
  fi
  t0=$SECONDS
  log "building $name $ver (cold: echo-basic ~40 s, CoreDNS ~6 min on 2 busy cores)"
  mkdir -p "$dir"
  if [ "$wrapper" = suite ]; then
    (cd "$here/conformance/$wrapper" && nice -n 10 go test -c -trimpath -ldflags "-s -w -buildid=" -o "$dir/.$name.tmp" "$pkg")
  else
    (cd "$here/conformance/$wrapper" && nice -n 10 go build -trimpath -ldflags "-s -w -buildid=" -o "$dir/.$name.tmp" "$pkg")
  fi
  mv -f "$dir/.$name.tmp" "$dir/$name"
  echo "$stamp" >"$dir/.$name.version"
  log "built $name in $((SECONDS - t0)) s"
done
paths
