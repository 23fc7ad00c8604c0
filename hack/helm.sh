#!/usr/bin/env bash
# Builds helm from the Go module proxy only, and caches it by version:
#
#   ${PORTICO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/tools}/helm-<ver>/helm
#
# The version is the one the wrapper module beside this script requires
# (helm/go.mod: tool helm.sh/helm/v4/cmd/helm, its go.sum pinning every dependency).
# make manifests, helm lint and go test ./deploy use this binary. Idempotent: when it is
# cached, only a stamp is checked. A cold build (empty Go build cache, modules already
# downloaded; ~16 s more to download them) takes ~6 min of CPU: ~3 min on 2 idle cores,
# 12.6 min measured on 2 cores shared with other builds.
#
#   helm.sh          build helm when missing, print its path
#   helm.sh path     print the path only
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

log() { echo "helm: $*" >&2; }

ver=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ {print $2; exit}' "$here/helm/go.mod")
[ -n "$ver" ] || { log "cannot read helm's version from helm/go.mod"; exit 1; }
cache=${PORTICO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/tools}
dir=$cache/helm-$ver
bin=$dir/helm

if [ "${1:-}" = path ]; then echo "$bin"; exit 0; fi

if [ -x "$bin" ] && [ "$(cat "$dir/.version" 2>/dev/null)" = "$ver" ]; then
  echo "$bin"
  exit 0
fi
t0=$SECONDS
log "building helm $ver (cold: ~3 min on 2 idle cores)"
mkdir -p "$dir"
# Helm's own release build: -trimpath, its version stamped in (helm version).
(cd "$here/helm" && nice go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$ver -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  -o "$dir/.helm.tmp" helm.sh/helm/v4/cmd/helm)
mv -f "$dir/.helm.tmp" "$bin"
echo "$ver" >"$dir/.version"
log "built helm $ver in $((SECONDS - t0)) s"
echo "$bin"
