{{/* Names. */}}
{{- define "peakfit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "peakfit.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<component>", kept within 63 characters. */}}
{{- define "peakfit.component" -}}
{{- printf "%s-%s" (include "peakfit.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{- define "peakfit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "peakfit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: peakfit
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: call with (dict "root" $ "component" "agent"). */}}
{{- define "peakfit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "peakfit.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "peakfit.componentLabels" -}}
{{ include "peakfit.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "peakfit.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
kube-scheduler's tag: the value, or the API server's version without a vendor suffix
(v1.33.4-eks-1a2b3c -> v1.33.4), so the scheduler matches the control plane it talks to.
*/}}
{{- define "peakfit.schedulerTag" -}}
{{- if .Values.scheduler.image.tag }}
{{- .Values.scheduler.image.tag }}
{{- else }}
{{- $v := regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- if $v }}
{{- $v }}
{{- else }}
{{- printf "v%s.%s.0" .Capabilities.KubeVersion.Major (regexFind "^[0-9]+" .Capabilities.KubeVersion.Minor) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Env shared by every peakfit container. */}}
{{- define "peakfit.logEnv" -}}
- name: PEAKFIT_LOG
  value: {{ .Values.log.level | quote }}
- name: PEAKFIT_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
{{- end }}

{{- define "peakfit.webhookTLSSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}
{{- required "webhook.tls.secret.name is required when webhook.tls.mode is secret" .Values.webhook.tls.secret.name }}
{{- else }}
{{- include "peakfit.component" (dict "root" . "component" "webhook-tls") }}
{{- end }}
{{- end }}

{{/* The extender's metrics port, parsed from extender.metricsListen ("" when disabled). */}}
{{- define "peakfit.extenderMetricsPort" -}}
{{- with .Values.extender.metricsListen }}
{{- regexFind "[0-9]+$" . }}
{{- end }}
{{- end }}

{{/*
The extended resource node GPU memory is advertised and requested as; empty when turned off.
*/}}
{{- define "peakfit.gpuMemoryResource" -}}
{{- if .Values.gpuMemoryResource.enabled }}{{ .Values.gpuMemoryResource.name }}{{ end }}
{{- end }}
