{{/*
Chart name, overridable with nameOverride.
*/}}
{{- define "pgdelta-cdc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Release-qualified name. Cut to 54 characters rather than the usual 63 because the
objects append "-capture", "-apply" or "-lake" and names stay within 63.
*/}}
{{- define "pgdelta-cdc.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pgdelta-cdc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pgdelta-cdc.labels" -}}
helm.sh/chart: {{ include "pgdelta-cdc.chart" . }}
{{ include "pgdelta-cdc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pgdelta-cdc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pgdelta-cdc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Image reference of one service: {{ include "pgdelta-cdc.image" (list . .Values.capture.image) }}
*/}}
{{- define "pgdelta-cdc.image" -}}
{{- $root := index . 0 }}
{{- $image := index . 1 }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/*
Name of the claim holding the lake.
*/}}
{{- define "pgdelta-cdc.lakeClaim" -}}
{{- default (printf "%s-lake" (include "pgdelta-cdc.fullname" .)) .Values.lake.persistence.existingClaim }}
{{- end }}
