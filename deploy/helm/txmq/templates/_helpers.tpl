{{/*
Names. The fullname is the release name, suffixed with the chart name unless it already
contains it; every object is "<fullname>-<component>".
*/}}
{{- define "txmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "txmq.fullname" -}}
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

{{- define "txmq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<fullname>-<component>"; call with (dict "root" $ "component" "broker"). */}}
{{- define "txmq.componentName" -}}
{{- printf "%s-%s" (include "txmq.fullname" .root) .component | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "txmq.headlessName" -}}
{{- printf "%s-headless" (include "txmq.componentName" .) }}
{{- end }}

{{/* Labels on every object. Selectors use only txmq.selectorLabels (no version). */}}
{{- define "txmq.labels" -}}
helm.sh/chart: {{ include "txmq.chart" .root }}
{{ include "txmq.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: txmq
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "txmq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "txmq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- if .shard }}
txmq.io/shard: {{ .shard }}
{{- end }}
{{- end }}

{{- define "txmq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "txmq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image of a component: (dict "root" $ "values" .Values.broker). The registry is
global.imageRegistry (bitnami's convention, e.g. a mirror for the whole cluster), else the
component's, else image.registry; a digest (component's, else image.digest) pins the image
and wins over the tag; tags may be given as numbers (--set broker.image.tag=9). */}}
{{- define "txmq.image" -}}
{{- $global := .root.Values.global | default dict }}
{{- $registry := $global.imageRegistry | default .values.image.registry | default .root.Values.image.registry }}
{{- $tag := toString (.values.image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion) }}
{{- $digest := .values.image.digest | default .root.Values.image.digest }}
{{- $ref := ternary (printf "@%s" $digest) (printf ":%s" $tag) (not (empty $digest)) }}
{{- if $registry }}
{{- printf "%s/%s%s" $registry .values.image.repository $ref }}
{{- else }}
{{- printf "%s%s" .values.image.repository $ref }}
{{- end }}
{{- end }}

{{/* The DNS suffix of this namespace's Services: "<namespace>.svc.<clusterDomain>". */}}
{{- define "txmq.svcDomain" -}}
{{- printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/*
Every name server pod, through the headless Service: brokers and checkers register with
each of them (comma-separated host:port).
*/}}
{{- define "txmq.nameserverAddresses" -}}
{{- $headless := include "txmq.headlessName" (dict "root" . "component" "nameserver") }}
{{- $pod := include "txmq.componentName" (dict "root" . "component" "nameserver") }}
{{- $addresses := list }}
{{- range $i := until (int .Values.nameserver.replicaCount) }}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s:%d" $pod $i $headless (include "txmq.svcDomain" $) (int $.Values.nameserver.port)) }}
{{- end }}
{{- join "," $addresses }}
{{- end }}

{{/*
A TXMQ_* setting value as the service parses it: integral numbers without exponent
(Helm reads every number as a float), booleans as true/false, the rest as text.
*/}}
{{- define "txmq.settingValue" -}}
{{- if kindIs "float64" . }}
{{- if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "bool" . }}
{{- ternary "true" "false" . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
The ConfigMap data of a component: the settings every service has, then the
component's own ".config" map, each as TXMQ_<FIELD> (upper case).
(dict "root" $ "values" .Values.broker)
*/}}
{{- define "txmq.settings" -}}
TXMQ_HOST: "0.0.0.0"
TXMQ_PORT: {{ .values.port | int | quote }}
TXMQ_METRICS_PORT: {{ .root.Values.metrics.port | int | quote }}
{{- range $field, $value := .values.config }}
{{ printf "TXMQ_%s" (upper $field) }}: {{ include "txmq.settingValue" $value | quote }}
{{- end }}
{{- end }}

{{/* Pod-level securityContext, shared. */}}
{{- define "txmq.podSecurityContext" -}}
{{- if .Values.podSecurityContext.enabled }}
securityContext:
  {{- toYaml (omit .Values.podSecurityContext "enabled") | nindent 2 }}
{{- end }}
{{- end }}

{{- define "txmq.containerSecurityContext" -}}
{{- if .Values.containerSecurityContext.enabled }}
securityContext:
  {{- toYaml (omit .Values.containerSecurityContext "enabled") | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Native gRPC probes on the gRPC port (the stock grpc.health.v1 service).
(dict "port" 10911 "probes" .Values.broker.probes)
*/}}
{{- define "txmq.probes" -}}
{{- $port := .port | int }}
{{- range $kind := list "startup" "readiness" "liveness" }}
{{- $p := index $.probes $kind }}
{{- if $p.enabled }}
{{ $kind }}Probe:
  grpc:
    port: {{ $port }}
  {{- toYaml (omit $p "enabled") | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Scheduling fields of a pod spec: (dict "root" $ "values" .Values.broker "component" "broker"),
optionally with "shard" (anti-affinity among that shard's replicas only) and "extraSpread"
(topologySpreadConstraints added to the values' own).
*/}}
{{- define "txmq.scheduling" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if eq .values.podAntiAffinityPreset "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "txmq.selectorLabels" . | nindent 14 }}
{{- else if eq .values.podAntiAffinityPreset "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "txmq.selectorLabels" . | nindent 12 }}
{{- end }}
{{- $spread := .values.topologySpreadConstraints }}
{{- with .extraSpread }}
{{- $spread = concat $spread . }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Replicated shards (broker.replicationFactor > 1): every shard's name, which is also the
name of its StatefulSet ("<fullname>-broker-<N>", as the broker pods of an unreplicated
release are named), comma-separated.
*/}}
{{- define "txmq.brokerShards" -}}
{{- $base := include "txmq.componentName" (dict "root" . "component" "broker") }}
{{- $shards := list }}
{{- range $i := until (int .Values.broker.replicaCount) }}
{{- $shards = append $shards (printf "%s-%d" $base $i) }}
{{- end }}
{{- join "," $shards }}
{{- end }}

{{/* The broker settings read only by replicated shards (left out of the pods otherwise). */}}
{{- define "txmq.replicationSettings" -}}
etcd_prefix,leader_lease_seconds,election_poll_seconds,replica_lag_max_seconds,replication_batch_bytes,replication_log_entries
{{- end }}

{{/*
The etcd client endpoints the brokers use (comma-separated host:port): every member of the
bundled etcd through its headless Service, or etcd.endpoints.
*/}}
{{- define "txmq.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $headless := include "txmq.headlessName" (dict "root" . "component" "etcd") }}
{{- $pod := include "txmq.componentName" (dict "root" . "component" "etcd") }}
{{- $endpoints := list }}
{{- range $i := until (int .Values.etcd.replicaCount) }}
{{- $endpoints = append $endpoints (printf "%s-%d.%s.%s:%d" $pod $i $headless (include "txmq.svcDomain" $) (int $.Values.etcd.clientPort)) }}
{{- end }}
{{- join "," $endpoints }}
{{- else }}
{{- join "," .Values.etcd.endpoints }}
{{- end }}
{{- end }}
