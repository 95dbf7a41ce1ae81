{{/* Names, labels and the settings several templates share. */}}

{{- define "titan.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "titan.fullname" -}}
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

{{- define "titan.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "titan.labels" -}}
helm.sh/chart: {{ include "titan.chart" .ctx }}
{{ include "titan.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: titan
{{- end }}

{{- define "titan.selectorLabels" -}}
app.kubernetes.io/name: {{ include "titan.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "titan.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "titan.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "titan.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret the pods take their environment from (created by the chart, or yours). */}}
{{- define "titan.secretName" -}}
{{- default (include "titan.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "titan.hasSecret" -}}
{{- if or .Values.secrets.existingSecret .Values.secrets.masterKey .Values.secrets.env }}true{{ end }}
{{- end }}

{{- define "titan.redisName" -}}
{{- printf "%s-redis" (include "titan.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "titan.redisSecretName" -}}
{{- default (include "titan.redisName" .) .Values.redis.auth.existingSecret }}
{{- end }}

{{- define "titan.redisSecretKey" -}}
{{- if .Values.redis.auth.existingSecret }}{{ .Values.redis.auth.existingSecretKey }}{{ else }}redis-password{{ end }}
{{- end }}

{{/* The storage URL written into titan.yaml. */}}
{{- define "titan.storageUrl" -}}
{{- if .Values.redis.enabled }}
{{- $auth := ternary ":${REDIS_PASSWORD}@" "" .Values.redis.auth.enabled }}
{{- printf "redis://%s%s:6379/0" $auth (include "titan.redisName" .) }}
{{- else if .Values.storage.url }}
{{- .Values.storage.url }}
{{- else }}
{{- print "sqlite:////var/lib/titan/titan.db" }}
{{- end }}
{{- end }}

{{/* Whether the storage is shared by pods (anything but the SQLite fallback). */}}
{{- define "titan.sharedStorage" -}}
{{- if or .Values.redis.enabled .Values.storage.url (index (default (dict) .Values.config.titan) "storage") }}true{{ end }}
{{- end }}

{{/* titan.yaml: the user's config with the chart's defaults under it (the user's keys win). */}}
{{- define "titan.config" -}}
{{- $user := deepCopy (default (dict) .Values.config.titan) }}
{{- $chart := dict "storage" (include "titan.storageUrl" .) }}
{{- if .Values.worker.enabled }}
{{- $_ := set $chart "jobs" (dict "workers" 0) }}
{{- end }}
{{- if or .Values.secrets.masterKey .Values.secrets.existingSecret }}
{{- $_ := set $chart "auth" (dict "master_key" "${TITAN_MASTER_KEY}") }}
{{- end }}
{{- toYaml (mustMergeOverwrite $chart $user) }}
{{- end }}

{{/* Checks that stop a release that could not work. */}}
{{- define "titan.validate" -}}
{{- if not (include "titan.sharedStorage" .) }}
{{- if .Values.worker.enabled }}
{{- fail "worker.enabled needs a shared storage: enable redis or set storage.url (workers and gateways must share the job queue)" }}
{{- end }}
{{- if or (gt (int .Values.gateway.replicas) 1) .Values.gateway.autoscaling.enabled }}
{{- fail "more than one gateway replica needs a shared storage: enable redis or set storage.url (keys, limits and usage live there)" }}
{{- end }}
{{- end }}
{{- if and .Values.redis.enabled .Values.storage.url }}
{{- fail "set either redis.enabled or storage.url, not both" }}
{{- end }}
{{- if and .Values.gateway.autoscaling.enabled (not .Values.gateway.autoscaling.targetCPUUtilizationPercentage) (not .Values.gateway.autoscaling.requestsWaiting.enabled) }}
{{- fail "gateway.autoscaling needs a metric: targetCPUUtilizationPercentage or requestsWaiting.enabled" }}
{{- end }}
{{- if and .Values.worker.keda.enabled (not .Values.worker.enabled) }}
{{- fail "worker.keda.enabled needs worker.enabled" }}
{{- end }}
{{- end }}

{{/* The writable volumes of a Titan container; call with (dict "ctx" $ "role" .Values.gateway). */}}
{{- define "titan.volumeMounts" -}}
- name: config
  mountPath: /etc/titan
  readOnly: true
- name: cache
  mountPath: /var/cache/titan
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: /var/lib/titan
{{- end }}

{{- define "titan.volumes" -}}
- name: config
  configMap:
    name: {{ include "titan.fullname" .ctx }}
- name: cache
  emptyDir:
    sizeLimit: {{ .role.cacheSizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .role.tmpSizeLimit }}
- name: data
  emptyDir: {}
{{- end }}

{{/* Environment shared by gateway and worker containers. */}}
{{- define "titan.env" -}}
{{- if and .ctx.Values.redis.enabled .ctx.Values.redis.auth.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "titan.redisSecretName" .ctx }}
      key: {{ include "titan.redisSecretKey" .ctx }}
{{- end }}
{{- with .role.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Restart pods when the config or the secrets change. */}}
{{- define "titan.checksums" -}}
checksum/config: {{ include "titan.config" . | sha256sum }}
checksum/secret: {{ print (toJson .Values.secrets) (toJson .Values.redis.auth) | sha256sum }}
{{- end }}
