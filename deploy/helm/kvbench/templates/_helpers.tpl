{{/* kvbench's chart helpers */}}
{{- define "kvbench.fullname" -}}
{{- printf "%s-kvbench" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvbench.labels" -}}
app.kubernetes.io/name: kvbench
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvbench.selector" -}}
app.kubernetes.io/name: kvbench
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvbench.image" -}}
{{ printf "%s/kvbench-%s:%s" .root.Values.image.registry .service .root.Values.image.tag }}
{{- end -}}

{{/* the bus: the NATS chart's service when it is enabled, else the given URL */}}
{{- define "kvbench.natsUrl" -}}
{{- if .Values.natsUrl -}}
{{ .Values.natsUrl }}
{{- else if .Values.nats.enabled -}}
{{ printf "nats://%s-nats:4222" .Release.Name }}
{{- else -}}
{{ fail "set natsUrl, or nats.enabled: true for the NATS chart" }}
{{- end -}}
{{- end -}}

{{/* copies of each stream and KV bucket: natsReplicas, else 3 on the clustered NATS chart (one server may die), else 1 */}}
{{- define "kvbench.natsReplicas" -}}
{{- if .Values.natsReplicas -}}
{{ .Values.natsReplicas }}
{{- else if and .Values.nats.enabled .Values.nats.config.cluster.enabled -}}
{{ min 3 (int .Values.nats.config.cluster.replicas) }}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{/* what every service reads: the bus (with its token from a Secret), its replication, and the log format */}}
{{- define "kvbench.commonEnv" -}}
- name: KVBENCH_NATS_URL
  value: {{ include "kvbench.natsUrl" . | quote }}
- name: KVBENCH_NATS_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .Values.natsToken.secretName }}, key: {{ .Values.natsToken.key }}}
- name: KVBENCH_NATS_REPLICAS
  value: {{ include "kvbench.natsReplicas" . | quote }}
- name: KVBENCH_LOG_JSON
  value: "true"
{{- end -}}

{{- define "kvbench.databaseEnv" -}}
- name: KVBENCH_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ .Values.database.secretName }}, key: {{ .Values.database.key }}}
{{- end -}}

{{/* the key stored secrets are encrypted with: the planner and the switch poller only */}}
{{- define "kvbench.secretsKeyEnv" -}}
- name: KVBENCH_SECRETS_KEY
  valueFrom:
    secretKeyRef: {name: {{ .Values.secretsKey.secretName }}, key: {{ .Values.secretsKey.key }}}
{{- end -}}
