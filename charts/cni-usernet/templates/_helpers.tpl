{{/* The labels every object carries, as in manifests/cni-usernet.yaml. */}}
{{- define "cni-usernet.labels" -}}
app.kubernetes.io/name: cni-usernet
{{- end }}

{{/* Checked values: a typo fails the install instead of a node. */}}
{{- define "cni-usernet.validate" -}}
{{- if not (has .Values.mode (list "standalone" "chain")) }}
{{- fail (printf "mode %q: want standalone or chain" .Values.mode) }}
{{- end }}
{{- if not (has .Values.gso (list "auto" "hardware" "software" "off")) }}
{{- fail (printf "gso %q: want auto, hardware, software or off" .Values.gso) }}
{{- end }}
{{- end }}
