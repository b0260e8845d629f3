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

{{- define "pgdelta-cdc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pgdelta-cdc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
One value as an environment variable's text: lists and maps as JSON (pydantic-settings
reads them so), whole numbers without an exponent (YAML numbers reach templates as
floats, and 268435456 would print as 2.68435456e+08), anything else as written.
*/}}
{{- define "pgdelta-cdc.envValue" -}}
{{- if or (kindIs "map" .) (kindIs "slice" .) }}
{{- toJson . }}
{{- else if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
A map of client properties or Spark confs as JSON with string values: the settings
are dict[str, str], and a YAML number (linger.ms: 5) must arrive as "5".
*/}}
{{- define "pgdelta-cdc.stringMapJson" -}}
{{- $out := dict }}
{{- range $key, $value := . }}
{{- $_ := set $out $key (include "pgdelta-cdc.envValue" $value) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The non-secret Kafka client properties of one service: kafka.client with the service's
own kafkaClient over it. A property named like a secret is refused, so no password can
end up in a ConfigMap. (list . "capture")
*/}}
{{- define "pgdelta-cdc.kafkaClient" -}}
{{- $root := index . 0 }}
{{- $service := index . 1 }}
{{- $own := (index $root.Values $service).kafkaClient }}
{{- $client := merge (deepCopy $own) $root.Values.kafka.client }}
{{- include "pgdelta-cdc.refuseSecretKeys" (list $client (printf "kafka.client or %s.kafkaClient" $service) $service) }}
{{- include "pgdelta-cdc.stringMapJson" $client }}
{{- end }}

{{/*
Fails when a map of client properties names a secret one, saying where it belongs.
(list $map "where it was given" service)
*/}}
{{- define "pgdelta-cdc.refuseSecretKeys" -}}
{{- $service := index . 2 }}
{{- range $key, $_ := index . 0 }}
{{- if regexMatch "(?i)(password|secret|jaas|oauthbearer\\.config|ssl\\.key\\.pem|keystore\\.key)" $key }}
{{- fail (printf "Kafka client property %q is a secret: put it in the Secret named by kafka.clientSecret (or %s.kafkaClientSecret), one key per property, not in %s" $key $service (index $ 1)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of the Secret of secret Kafka client properties one service mounts, or "".
*/}}
{{- define "pgdelta-cdc.kafkaClientSecret" -}}
{{- $root := index . 0 }}
{{- $service := index . 1 }}
{{- default $root.Values.kafka.clientSecret (index $root.Values $service).kafkaClientSecret }}
{{- end }}

{{/*
Where mounted secrets and scratch space live in the containers.
*/}}
{{- define "pgdelta-cdc.postgresPasswordFile" -}}/var/run/secrets/pgdelta-cdc/postgres/password{{- end }}
{{- define "pgdelta-cdc.kafkaSecretsDir" -}}/var/run/secrets/pgdelta-cdc/kafka{{- end }}
{{- define "pgdelta-cdc.registryPasswordFile" -}}/var/run/secrets/pgdelta-cdc/registry/password{{- end }}
{{- define "pgdelta-cdc.spoolDir" -}}/var/lib/pgdelta-cdc/spool{{- end }}
{{- define "pgdelta-cdc.sparkLocalDir" -}}/var/lib/pgdelta-cdc/spark{{- end }}
{{- define "pgdelta-cdc.home" -}}/home/cdc{{- end }}

{{/*
The ConfigMap data of one service: the settings the chart computes, with the
service's `settings` map over them. (list . "capture" $computed) where $computed maps
variable names to values.

The map may not set what the chart wires itself: a secret (it would sit in a
ConfigMap), the files and directories secrets are mounted at, the metrics address the
probes and Service use, and the Kafka names both services must agree on. Each refusal
names the value to use instead.
*/}}
{{- define "pgdelta-cdc.settingsData" -}}
{{- $root := index . 0 }}
{{- $service := index . 1 }}
{{- $data := index . 2 }}
{{- $prefix := printf "%s_" (upper $service) }}
{{- $wired := dict
  "METRICS__HOST" (printf "the chart listens on 0.0.0.0 so the probes reach it")
  "METRICS__PORT" (printf "set %s.metrics.port" $service)
  "METRICS__ENABLED" (printf "set %s.metrics.enabled" $service)
  "POSTGRES__PASSWORD_FILE" "set postgres.existingSecret"
  "KAFKA__CLIENT_SECRETS_DIR" (printf "set kafka.clientSecret or %s.kafkaClientSecret" $service)
  "KAFKA__CLIENT" (printf "set kafka.client or %s.kafkaClient" $service)
  "KAFKA__BOOTSTRAP_SERVERS" "set kafka.bootstrapServers (both services)"
  "KAFKA__TOPIC_PREFIX" "set kafka.topicPrefix (both services)"
  "KAFKA__CONTROL_TOPIC" "set kafka.controlTopic (both services)"
  "KAFKA__SCHEMA_TOPIC" "set kafka.schemaTopic (both services)"
  "KAFKA__REGISTRY__URL" "set kafka.registry.url (both services)"
  "KAFKA__REGISTRY__SUBJECT_STRATEGY" "set kafka.registry.subjectStrategy (both services)"
  "KAFKA__REGISTRY__PASSWORD_FILE" "set kafka.registry.existingSecret"
}}
{{- range $name, $value := (index $root.Values $service).settings }}
{{- if not (hasPrefix $prefix $name) }}
{{- fail (printf "%s.settings.%s: only %s* variables belong here (docs/configuration.md)" $service $name $prefix) }}
{{- end }}
{{- $bare := trimPrefix $prefix $name }}
{{- if hasKey $wired $bare }}
{{- fail (printf "%s.settings.%s is wired by the chart: %s" $service $name (get $wired $bare)) }}
{{- end }}
{{- if regexMatch "(?i)(password|secret)" $bare }}
{{- fail (printf "%s.settings.%s would put a secret in a ConfigMap: use a Secret (postgres.existingSecret, kafka.clientSecret, or %s.extraEnv with valueFrom.secretKeyRef)" $service $name $service) }}
{{- end }}
{{- if kindIs "map" $value }}
{{- include "pgdelta-cdc.refuseSecretKeys" (list $value (printf "%s.settings.%s" $service $name) $service) }}
{{- end }}
{{- if not (kindIs "invalid" $value) }}
{{- $_ := set $data $name $value }}
{{- end }}
{{- end }}
{{- range $name, $value := $data }}
{{ $name }}: {{ include "pgdelta-cdc.envValue" $value | toJson }}
{{- end }}
{{- end }}

{{/*
Probes of one service on its metrics port. (list . "capture")
*/}}
{{- define "pgdelta-cdc.probes" -}}
{{- $root := index . 0 }}
{{- $values := index $root.Values (index . 1) }}
{{- if $values.metrics.enabled }}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml $values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml $values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml $values.probes.readiness | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The Schema Registry settings of one service, added to its ConfigMap data; none without
kafka.registry.url. (list . "CAPTURE_" $data)
*/}}
{{- define "pgdelta-cdc.registrySettings" -}}
{{- $root := index . 0 }}
{{- $prefix := index . 1 }}
{{- $data := index . 2 }}
{{- $registry := $root.Values.kafka.registry }}
{{- if $registry.url }}
{{- $_ := set $data (printf "%sKAFKA__REGISTRY__URL" $prefix) $registry.url }}
{{- $_ := set $data (printf "%sKAFKA__REGISTRY__SUBJECT_STRATEGY" $prefix) $registry.subjectStrategy }}
{{- $_ := set $data (printf "%sKAFKA__REGISTRY__TIMEOUT_S" $prefix) $registry.timeoutS }}
{{- with $registry.username }}
{{- $_ := set $data (printf "%sKAFKA__REGISTRY__USERNAME" $prefix) . }}
{{- end }}
{{- with $registry.caFile }}
{{- $_ := set $data (printf "%sKAFKA__REGISTRY__CA_FILE" $prefix) . }}
{{- end }}
{{- if $registry.existingSecret }}
{{- $_ := set $data (printf "%sKAFKA__REGISTRY__PASSWORD_FILE" $prefix) (include "pgdelta-cdc.registryPasswordFile" $root) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The registry password's volume and mount, for both Deployments.
*/}}
{{- define "pgdelta-cdc.registryPasswordMount" -}}
{{- if and .Values.kafka.registry.url .Values.kafka.registry.existingSecret }}
- name: registry-password
  mountPath: {{ include "pgdelta-cdc.registryPasswordFile" . | dir }}
  readOnly: true
{{- end }}
{{- end }}
{{- define "pgdelta-cdc.registryPasswordVolume" -}}
{{- if and .Values.kafka.registry.url .Values.kafka.registry.existingSecret }}
- name: registry-password
  secret:
    secretName: {{ .Values.kafka.registry.existingSecret }}
    items:
      - key: {{ .Values.kafka.registry.passwordKey }}
        path: {{ include "pgdelta-cdc.registryPasswordFile" . | base }}
    defaultMode: 0440
{{- end }}
{{- end }}
