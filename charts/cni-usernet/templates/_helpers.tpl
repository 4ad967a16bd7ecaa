{{/*
Names and labels, as `helm create` writes them. With the release named
cni-usernet (the documented install) every object is named cni-usernet, as
in manifests/cni-usernet.yaml.
*/}}

{{/* The app's name: the chart's, or nameOverride. */}}
{{- define "cni-usernet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it
contains the app's name, else <release>-<name>. 63 characters at most
(a label value).
*/}}
{{- define "cni-usernet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "cni-usernet.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* helm.sh/chart: name-version. */}}
{{- define "cni-usernet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The DaemonSet's selector, and so the Service's. The app's name alone, as
Cilium's k8s-app: a DaemonSet's selector cannot change after it is
created, the manifest and earlier releases select by this label only, and
a cluster has one network plugin (one release of this chart).
*/}}
{{- define "cni-usernet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cni-usernet.name" . }}
{{- end }}

{{/*
What the agent's pods carry: the selector and the labels that do not
change with the chart's version (a new chart version alone restarts no
agent).
*/}}
{{- define "cni-usernet.podLabels" -}}
{{ include "cni-usernet.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: cni-usernet
{{- end }}

{{/* Every object: Kubernetes' recommended labels. */}}
{{- define "cni-usernet.labels" -}}
{{ include "cni-usernet.podLabels" . }}
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "cni-usernet.chart" . }}
{{- end }}

{{/* The agent's image: repository:tag (tag default: appVersion), or repository@digest. */}}
{{- define "cni-usernet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* --metrics-address: IP:port, [IPv6]:port, or :port on every address. */}}
{{- define "cni-usernet.metricsAddress" -}}
{{- $a := .Values.metrics.address | default "" }}
{{- if and (contains ":" $a) (not (hasPrefix "[" $a)) }}
{{- $a = printf "[%s]" $a }}
{{- end }}
{{- printf "%s:%d" $a (int .Values.metrics.port) }}
{{- end }}

{{/* The agent's ServiceAccount: serviceAccount.name, else the objects' name. */}}
{{- define "cni-usernet.serviceAccountName" -}}
{{- default (include "cni-usernet.fullname" .) .Values.serviceAccount.name }}
{{- end }}
