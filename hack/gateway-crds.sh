#!/usr/bin/env bash
# Copies Gateway API's standard-channel CRDs, at the version go.mod requires
# (sigs.k8s.io/gateway-api), from the Go module cache into the chart
# (deploy/helm/portico/crds/gateway-api/), byte for byte as upstream ships them
# (make api; make verify checks the copy). Left out: upstream's
# ValidatingAdmissionPolicy against installing the experimental channel over
# the standard one (gateway.networking.k8s.io_vap_safeupgrades.yaml), which is
# not a CRD: Helm's crds/ folder is for CRDs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
go mod download sigs.k8s.io/gateway-api
dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
out=deploy/helm/portico/crds/gateway-api
rm -rf "$out"
mkdir -p "$out"
for f in "$dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml; do
  case $f in *_vap_*) continue ;; esac
  install -m 0644 "$f" "$out/"
done
