{{/*
The labels every object of the chart carries. The same on the plain manifests
(make manifests), so no Helm-only labels: the DaemonSet's pod template is also the
one the control plane derives IngressClaim DaemonSets from.
*/}}
{{- define "portico.labels" -}}
app.kubernetes.io/name: portico-agent
app.kubernetes.io/part-of: portico
{{- end }}

{{/* The agent image: repository:tag, or repository@sha256:... for a digest. */}}
{{- define "portico.image" -}}
{{ .Values.image.repository }}{{ ternary "@" ":" (hasPrefix "sha256:" .Values.image.tag) }}{{ .Values.image.tag }}
{{- end }}

{{/* The group this DaemonSet serves: namespace/name of its group Service. */}}
{{- define "portico.group" -}}
{{ .Release.Namespace }}/{{ .Values.group.name }}
{{- end }}
