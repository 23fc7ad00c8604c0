#!/usr/bin/env bash
# Builds promtool (Prometheus's rule checker and rule unit-test runner) from the Go
# module proxy only, and caches it by version:
#
#   ${PORTICO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/tools}/promtool-<ver>/promtool
#
# The version is the one the wrapper module beside this script requires
# (promtool/go.mod: tool github.com/prometheus/prometheus/cmd/promtool, its go.sum
# pinning every dependency), and beside it promql-selectors (promtool/promql-selectors:
# what each PromQL expression reads, by Prometheus's own parser). go test ./deploy
# runs them on the chart's alert rules (promtool check rules, promtool test rules)
# and dashboard (every metric and label named is one Portico exports). Idempotent:
# when both are cached, only a stamp (the version and a digest of
# promql-selectors' source and go.sum) is checked (~0.7 s). A cold build (modules
# already downloaded; ~3 min more to download them) takes ~16 min of CPU: ~8 min on
# 2 idle cores, 62 min measured on 2 cores shared with a CI run; a warm relink ~26 s.
#
#   promtool.sh          build them when missing, print promtool's path
#   promtool.sh path     print promtool's path only (promql-selectors is beside it)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

log() { echo "promtool: $*" >&2; }

# A require line of its own or in a block.
ver=$(awk -v m=github.com/prometheus/prometheus '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$here/promtool/go.mod")
[ -n "$ver" ] || { log "cannot read prometheus's version from promtool/go.mod"; exit 1; }
cache=${PORTICO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/tools}
dir=$cache/promtool-$ver
bin=$dir/promtool

if [ "${1:-}" = path ]; then echo "$bin"; exit 0; fi

stamp="$ver $(cat "$here/promtool/go.sum" "$here/promtool/promql-selectors/main.go" | sha256sum | cut -c1-16)"
if [ -x "$bin" ] && [ -x "$dir/promql-selectors" ] && [ "$(cat "$dir/.version" 2>/dev/null)" = "$stamp" ]; then
  echo "$bin"
  exit 0
fi
t0=$SECONDS
log "building promtool $ver and promql-selectors (cold: ~8 min on 2 idle cores)"
mkdir -p "$dir"
# Prometheus's release build stamps its version through prometheus/common's
# version package (promtool --version).
(cd "$here/promtool" && nice go build -trimpath \
  -ldflags "-s -w -X github.com/prometheus/common/version.Version=${ver#v}" \
  -o "$dir/.promtool.tmp" github.com/prometheus/prometheus/cmd/promtool)
(cd "$here/promtool" && nice go build -trimpath -ldflags "-s -w" -o "$dir/.promql-selectors.tmp" ./promql-selectors)
mv -f "$dir/.promtool.tmp" "$bin"
mv -f "$dir/.promql-selectors.tmp" "$dir/promql-selectors"
echo "$stamp" >"$dir/.version"
log "built promtool $ver in $((SECONDS - t0)) s"
echo "$bin"
