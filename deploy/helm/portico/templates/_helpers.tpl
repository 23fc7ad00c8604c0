{{/*
The labels every object of the chart carries. The same on the plain manifests
(make manifests), so no Helm-only labels: the DaemonSet's pod template is also the
one the control plane derives IngressClaim DaemonSets from.
*/}}
{{- define "portico.labels" -}}
app.kubernetes.io/name: portico-agent
app.kubernetes.io/part-of: portico
{{- end }}

{{/* The agent image: repository:tag, or repository@sha256:... for a digest; no
tag is the chart's release, v<appVersion>. */}}
{{- define "portico.image" -}}
{{- $tag := .Values.image.tag | default (printf "v%s" .Chart.AppVersion) -}}
{{ .Values.image.repository }}{{ ternary "@" ":" (hasPrefix "sha256:" $tag) }}{{ $tag }}
{{- end }}

{{/* The group this DaemonSet serves: namespace/name of its group Service. */}}
{{- define "portico.group" -}}
{{ .Release.Namespace }}/{{ .Values.group.name }}
{{- end }}

{{/*
The flags the agents and the controller must share: each builds the same
configuration from the same objects (the same pools, reserved ports and group
namespaces), so the controller's statuses and refusals are what the edges serve.
*/}}
{{- define "portico.sharedArgs" -}}
# The group the agents serve (namespace/name of its group Service).
- --group={{ include "portico.group" . }}
# The image of the agent DaemonSets the controller provisions for IngressClaims:
# this one.
- --claim-image={{ include "portico.image" . }}
# Where those DaemonSets' agents run, and on which NIC: the operator's, never what
# a claim asks (its agents are privileged hostNetwork pods; a claim's node selector
# may narrow values.yaml claims.nodeSelector).
- --claim-iface={{ dig "claims" "iface" "" .Values.AsMap | default .Values.iface }}
{{- with dig "claims" "nodeSelector" dict .Values.AsMap }}
- --claim-node-selector={{ $parts := list }}{{ range $k, $v := . }}{{ $parts = append $parts (printf "%s=%s" $k $v) }}{{ end }}{{ join "," $parts }}
{{- end }}
# Prometheus /metrics and the /healthz, /readyz probes below (the agents' port is
# reserved: no L4 Service may take it).
- --metrics-addr=:9101
{{- with .Values.vipPool }}
# VIPs the leader allocates to groups and L4 Services without a portico.io/vip
# annotation (CIDR, optionally "!excluded,..."; several separated by ";"). Use a
# free range of the edge segment.
- --vip-pool={{ . }}
{{- end }}
# Liveness checks of every replica's nginx (port 0: off).
- --liveness-port={{ .Values.liveness.port }}
{{- with .Values.groupNamespaces }}
# Namespaces beyond the release's where groups and IngressClaims are served.
- --group-namespaces={{ join "," . }}
{{- end }}
{{- with .Values.reservedPorts }}
# Ports other daemons of the edge nodes listen on: no L4 Service may take them.
- --reserved-ports={{ join "," . }}
{{- end }}
# XDP in native mode or not at all (native), or native where the NIC takes it and
# generic elsewhere (best-effort); the controller gives the IngressClaim agents the same.
- --xdp-mode={{ .Values.xdpMode }}
{{- end }}
