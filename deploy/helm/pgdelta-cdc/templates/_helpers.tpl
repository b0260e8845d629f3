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
{{- if and (eq $service "apply") (include "pgdelta-cdc.sparkOnKubernetes" $root) }}
{{- $_ := set $wired "SPARK__MASTER" "in kubernetes mode the master is k8s://<apply.spark.kubernetes.apiServer>" }}
{{- $_ := set $wired "SPARK__CONF" "in kubernetes mode set apply.spark.conf, which the chart completes with the executors' wiring" }}
{{- end }}
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

{{/*
"true" when the lake (tables and checkpoints) is on object storage rather than the volume.
*/}}
{{- define "pgdelta-cdc.lakeOnObjectStore" -}}
{{- if regexMatch "^(s3a|abfss|gs)://" .Values.lake.root }}true{{- end }}
{{- end }}

{{/*
"true" when the apply pod is a Spark driver whose executors are pods of their own.
*/}}
{{- define "pgdelta-cdc.sparkOnKubernetes" -}}
{{- if eq .Values.apply.spark.mode "kubernetes" }}true{{- end }}
{{- end }}

{{/*
ServiceAccount of the apply pod: in kubernetes mode the driver's own (it holds the Role
and mounts its token), so capture never gets API rights; else the chart's shared one.
*/}}
{{- define "pgdelta-cdc.applyServiceAccountName" -}}
{{- if include "pgdelta-cdc.sparkOnKubernetes" . }}
{{- default (printf "%s-apply" (include "pgdelta-cdc.fullname" .)) .Values.apply.spark.kubernetes.serviceAccountName }}
{{- else }}
{{- include "pgdelta-cdc.serviceAccountName" . }}
{{- end }}
{{- end }}

{{/*
Names and paths of the kubernetes mode's objects.
*/}}
{{- define "pgdelta-cdc.driverService" -}}{{ include "pgdelta-cdc.fullname" . }}-driver{{- end }}
{{- define "pgdelta-cdc.driverHost" -}}{{ include "pgdelta-cdc.driverService" . }}.{{ .Release.Namespace }}.svc{{- end }}
{{- define "pgdelta-cdc.executorTemplateDir" -}}/etc/pgdelta-cdc/spark{{- end }}
{{- define "pgdelta-cdc.executorTemplateFile" -}}executor-pod-template.yaml{{- end }}
{{- define "pgdelta-cdc.executorCommand" -}}/opt/cdc/bin/spark-executor{{- end }}

{{/*
Fails when a map of Spark or Hadoop settings names a secret one: object-store keys and
tokens must not sit in a ConfigMap. (list $map "where it was given")
*/}}
{{- define "pgdelta-cdc.refuseSecretConf" -}}
{{- range $key, $_ := index . 0 }}
{{- if regexMatch "(?i)(secret|password|jaas|access\\.key|account\\.key|private\\.key|token$)" $key }}
{{- fail (printf "%s: %q is a secret and would sit in a ConfigMap: object-store credentials come from lake.s3.existingSecret or workload identity, anything else from a Secret through apply.extraEnv (docs/deploy.md, Lake on object storage)" (index $ 1) $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The Hadoop settings of an object-store lake, as spark.hadoop.* confs (JSON).
*/}}
{{- define "pgdelta-cdc.objectStoreConf" -}}
{{- $lake := .Values.lake }}
{{- include "pgdelta-cdc.refuseSecretConf" (list $lake.hadoopConf "lake.hadoopConf") }}
{{- $conf := dict }}
{{- range $key, $value := $lake.hadoopConf }}
{{- $_ := set $conf (printf "spark.hadoop.%s" $key) (include "pgdelta-cdc.envValue" $value) }}
{{- end }}
{{- if hasPrefix "s3a://" $lake.root }}
{{- $provider := "software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider" }}
{{- if eq $lake.s3.credentials "secret" }}
{{- $provider = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider" }}
{{- end }}
{{- $_ := set $conf "spark.hadoop.fs.s3a.aws.credentials.provider" $provider }}
{{- $_ := set $conf "spark.hadoop.fs.s3a.path.style.access" (toString $lake.s3.pathStyleAccess) }}
{{- /* S3A buffers each upload on disk first; by default under /tmp, a small emptyDir here. */}}
{{- $_ := set $conf "spark.hadoop.fs.s3a.buffer.dir" (printf "%s/s3a" (include "pgdelta-cdc.sparkLocalDir" .)) }}
{{- with $lake.s3.endpoint }}
{{- $_ := set $conf "spark.hadoop.fs.s3a.endpoint" . }}
{{- end }}
{{- with $lake.s3.region }}
{{- $_ := set $conf "spark.hadoop.fs.s3a.endpoint.region" . }}
{{- end }}
{{- end }}
{{- toJson $conf }}
{{- end }}

{{/*
The S3 credentials as environment variables from the Secret lake.s3.existingSecret, for
the driver and the executors; nothing unless lake.s3.credentials is secret.
*/}}
{{- define "pgdelta-cdc.objectStoreEnv" -}}
{{- $s3 := .Values.lake.s3 }}
{{- if and (hasPrefix "s3a://" .Values.lake.root) (eq $s3.credentials "secret") }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ $s3.existingSecret }}
      key: {{ $s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $s3.existingSecret }}
      key: {{ $s3.secretAccessKeyKey }}
{{- end }}
{{- end }}

{{/*
The Spark confs that make the apply pod a client-mode driver with executor pods (JSON).
Every one is the chart's: apply.spark.conf may not set them (pgdelta-cdc.sparkConf).
*/}}
{{- define "pgdelta-cdc.kubernetesSparkConf" -}}
{{- $k8s := .Values.apply.spark.kubernetes }}
{{- $executor := $k8s.executor }}
{{- $conf := dict
  "spark.submit.deployMode" "client"
  "spark.kubernetes.namespace" .Release.Namespace
  "spark.kubernetes.container.image" (include "pgdelta-cdc.image" (list . .Values.apply.image))
  "spark.kubernetes.container.image.pullPolicy" .Values.apply.image.pullPolicy
  "spark.kubernetes.executor.podTemplateFile" (printf "%s/%s" (include "pgdelta-cdc.executorTemplateDir" .) (include "pgdelta-cdc.executorTemplateFile" .))
  "spark.kubernetes.executor.podTemplateContainerName" "executor"
  "spark.kubernetes.authenticate.executor.serviceAccountName" (include "pgdelta-cdc.applyServiceAccountName" .)
  "spark.kubernetes.driver.pod.name" "${env:SPARK_DRIVER_POD_NAME}"
  "spark.driver.host" (include "pgdelta-cdc.driverHost" .)
  "spark.driver.bindAddress" "0.0.0.0"
  "spark.driver.port" (include "pgdelta-cdc.envValue" $k8s.driverPort)
  "spark.blockManager.port" (include "pgdelta-cdc.envValue" $k8s.blockManagerPort)
  "spark.driver.blockManager.port" (include "pgdelta-cdc.envValue" $k8s.blockManagerPort)
  "spark.executor.instances" (include "pgdelta-cdc.envValue" $executor.instances)
  "spark.executor.cores" (include "pgdelta-cdc.envValue" $executor.cores)
  "spark.executor.memory" (toString $executor.memory)
}}
{{- with .Values.imagePullSecrets }}
{{- $names := list }}
{{- range . }}
{{- $names = append $names .name }}
{{- end }}
{{- $_ := set $conf "spark.kubernetes.container.image.pullSecrets" (join "," $names) }}
{{- end }}
{{- with $executor.memoryOverhead }}
{{- $_ := set $conf "spark.executor.memoryOverhead" (toString .) }}
{{- end }}
{{- with $executor.requestCores }}
{{- $_ := set $conf "spark.kubernetes.executor.request.cores" (toString .) }}
{{- end }}
{{- with $executor.limitCores }}
{{- $_ := set $conf "spark.kubernetes.executor.limit.cores" (toString .) }}
{{- end }}
{{- toJson $conf }}
{{- end }}

{{/*
APPLY_SPARK__CONF as a map: apply.spark.conf, with the object-store settings and the
scratch spark.local.dir under it (the values win), and in kubernetes mode the wiring
confs, which the values may not set.
*/}}
{{- define "pgdelta-cdc.sparkConf" -}}
{{- $spark := .Values.apply.spark }}
{{- include "pgdelta-cdc.refuseSecretConf" (list $spark.conf "apply.spark.conf") }}
{{- $conf := deepCopy $spark.conf }}
{{- if include "pgdelta-cdc.sparkOnKubernetes" . }}
{{- $wired := dict
  "spark.master" "set apply.spark.kubernetes.apiServer"
  "spark.submit.deployMode" "the driver runs in client mode, in the apply pod"
  "spark.kubernetes.namespace" "executors run in the release namespace"
  "spark.kubernetes.container.image" "set apply.image"
  "spark.kubernetes.container.image.pullPolicy" "set apply.image.pullPolicy"
  "spark.kubernetes.executor.podTemplateFile" "set apply.spark.kubernetes.executor.*"
  "spark.kubernetes.executor.podTemplateContainerName" "set apply.spark.kubernetes.executor.*"
  "spark.kubernetes.authenticate.executor.serviceAccountName" "set apply.spark.kubernetes.serviceAccountName"
  "spark.kubernetes.driver.pod.name" "the chart names the apply pod"
  "spark.driver.host" "the chart's headless Service is the driver's address"
  "spark.driver.bindAddress" "the driver listens on all interfaces"
  "spark.driver.port" "set apply.spark.kubernetes.driverPort"
  "spark.blockManager.port" "set apply.spark.kubernetes.blockManagerPort"
  "spark.driver.blockManager.port" "set apply.spark.kubernetes.blockManagerPort"
  "spark.executor.instances" "set apply.spark.kubernetes.executor.instances"
  "spark.executor.cores" "set apply.spark.kubernetes.executor.cores"
  "spark.executor.memory" "set apply.spark.kubernetes.executor.memory"
  "spark.executor.memoryOverhead" "set apply.spark.kubernetes.executor.memoryOverhead"
  "spark.kubernetes.executor.request.cores" "set apply.spark.kubernetes.executor.requestCores"
  "spark.kubernetes.executor.limit.cores" "set apply.spark.kubernetes.executor.limitCores"
  "spark.kubernetes.container.image.pullSecrets" "set imagePullSecrets"
}}
{{- range $key, $_ := $conf }}
{{- if hasKey $wired $key }}
{{- fail (printf "apply.spark.conf.%s is wired by the chart in kubernetes mode: %s" $key (get $wired $key)) }}
{{- end }}
{{- end }}
{{- $conf = merge $conf (include "pgdelta-cdc.kubernetesSparkConf" . | fromJson) }}
{{- end }}
{{- $conf = merge $conf (include "pgdelta-cdc.objectStoreConf" . | fromJson) }}
{{- $conf = merge $conf (dict "spark.local.dir" (include "pgdelta-cdc.sparkLocalDir" .)) }}
{{- toJson $conf }}
{{- end }}

{{/*
Labels of the executor pods: the chart's selector labels, so the chart's NetworkPolicy
covers them, and a component of their own, so no Service or budget of the driver does.
*/}}
{{- define "pgdelta-cdc.executorLabels" -}}
{{ include "pgdelta-cdc.selectorLabels" . }}
app.kubernetes.io/component: apply-executor
{{- end }}

{{/*
The apply pod and its executors, for the kubernetes mode's NetworkPolicy.
*/}}
{{- define "pgdelta-cdc.sparkPodSelector" -}}
matchLabels:
  {{- include "pgdelta-cdc.selectorLabels" . | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: [apply, apply-executor]
{{- end }}
