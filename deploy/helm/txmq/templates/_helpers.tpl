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
{{- if .component }}
{{- include "txmq.tlsSettings" . }}
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
Native gRPC probes on the gRPC port (the stock grpc.health.v1 service); with TLS on, on the
plaintext health port (the kubelet's gRPC probes cannot speak TLS).
(dict "root" $ "port" 10911 "probes" .Values.broker.probes)
*/}}
{{- define "txmq.probes" -}}
{{- $port := ternary .root.Values.tls.healthPort .port .root.Values.tls.enabled | int }}
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
etcd_prefix,etcd_user,etcd_password_file,leader_lease_seconds,election_poll_seconds,replica_lag_max_seconds,replication_batch_bytes,replication_log_entries
{{- end }}

{{/*
The etcd client endpoints the brokers use (comma-separated host:port): every member of the
bundled etcd through its headless Service (https:// with TLS on: the brokers present their
certificates), or etcd.endpoints (https://host:port for an existing etcd with TLS).
*/}}
{{- define "txmq.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $headless := include "txmq.headlessName" (dict "root" . "component" "etcd") }}
{{- $pod := include "txmq.componentName" (dict "root" . "component" "etcd") }}
{{- $endpoints := list }}
{{- $scheme := ternary "https://" "" .Values.tls.enabled }}
{{- range $i := until (int .Values.etcd.replicaCount) }}
{{- $endpoints = append $endpoints (printf "%s%s-%d.%s.%s:%d" $scheme $pod $i $headless (include "txmq.svcDomain" $) (int $.Values.etcd.clientPort)) }}
{{- end }}
{{- join "," $endpoints }}
{{- else }}
{{- join "," .Values.etcd.endpoints }}
{{- end }}
{{- end }}

{{/*
TLS (values "tls"). Each component's certificate is a Secret of type kubernetes.io/tls with
ca.crt (cert-manager's layout), "<fullname>-<component>-tls" unless tls.secretNames names
another, mounted at tls.mountPath. (dict "root" $ "component" "broker")
*/}}
{{- define "txmq.tlsSecretName" -}}
{{- $named := "" }}
{{- if eq (include "txmq.tlsMode" .root) "secrets" }}
{{- $named = index .root.Values.tls.secretNames .component | default "" }}
{{- end }}
{{- $named | default (printf "%s-tls" (include "txmq.componentName" .)) }}
{{- end }}

{{/*
Where the TLS certificates come from: "off" (tls.enabled false), "certManager" (a
Certificate per component), "generated" (the chart's own CA, templates/generated-secrets.yaml)
or "secrets" (Secrets the operator made).
*/}}
{{- define "txmq.tlsMode" -}}
{{- $t := .Values.tls }}
{{- if not $t.enabled }}off{{ else if $t.certManager.enabled }}certManager{{ else if $t.autoGenerated.enabled }}generated{{ else }}secrets{{ end }}
{{- end }}

{{/*
Resource requests and limits of a container: the component's `resources` when set, else its
`resourcesPreset` (sized from this project's measurements: chart README, "Resources"); a
broker's `coresPerShard` is its CPU request unless resources.requests.cpu says otherwise.
(dict "root" $ "values" .Values.broker "component" "broker")
*/}}
{{- define "txmq.resources" -}}
{{- $r := deepCopy (.values.resources | default dict) }}
{{- if not $r }}
{{- $preset := .values.resourcesPreset | default "none" }}
{{- if ne $preset "none" }}
{{- $r = deepCopy (index (index (include "txmq.resourcePresets" . | fromYaml) .component) $preset) }}
{{- end }}
{{- end }}
{{- if and (eq .component "broker") (gt (float64 (.values.coresPerShard | default 0)) 0.0) (not (dig "requests" "cpu" "" (.values.resources | default dict))) }}
{{- $_ := set $r "requests" (merge (dict "cpu" (toString .values.coresPerShard)) (dig "requests" dict $r)) }}
{{- end }}
{{- with $r }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The presets. Measured (docs/performance.md, and `ps` of idle services): a broker's resident
memory 70 MiB idle, 73-226 MiB from 1 to 32 producers, and at most one core (one Python
event loop); a name server, checker or proxy 50-55 MiB idle. No CPU limits: a throttled
broker answers late, and one uses a core at the most anyway.
*/}}
{{- define "txmq.resourcePresets" -}}
nameserver:
  small: {requests: {cpu: 50m, memory: 96Mi}, limits: {memory: 256Mi}}
  medium: {requests: {cpu: 250m, memory: 128Mi}, limits: {memory: 512Mi}}
  large: {requests: {cpu: 500m, memory: 256Mi}, limits: {memory: 1Gi}}
broker:
  small: {requests: {cpu: 250m, memory: 256Mi}, limits: {memory: 1Gi}}
  medium: {requests: {cpu: "1", memory: 512Mi}, limits: {memory: 2Gi}}
  large: {requests: {cpu: "1", memory: 1Gi}, limits: {memory: 4Gi}}
checker:
  small: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}
  medium: {requests: {cpu: 500m, memory: 256Mi}, limits: {memory: 1Gi}}
  large: {requests: {cpu: "1", memory: 512Mi}, limits: {memory: 2Gi}}
proxy:
  small: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}
  medium: {requests: {cpu: 500m, memory: 256Mi}, limits: {memory: 1Gi}}
  large: {requests: {cpu: "1", memory: 512Mi}, limits: {memory: 2Gi}}
etcd:
  small: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}
  medium: {requests: {cpu: 500m, memory: 512Mi}, limits: {memory: 2Gi}}
  large: {requests: {cpu: "1", memory: 1Gi}, limits: {memory: 4Gi}}
{{- end }}

{{/* The TLS settings of a component's ConfigMap (nothing with TLS off). */}}
{{- define "txmq.tlsSettings" -}}
{{- $tls := .root.Values.tls }}
{{- if $tls.enabled }}
TXMQ_TLS_CERT_FILE: {{ printf "%s/tls.crt" $tls.mountPath | quote }}
TXMQ_TLS_KEY_FILE: {{ printf "%s/tls.key" $tls.mountPath | quote }}
TXMQ_TLS_CA_FILE: {{ printf "%s/ca.crt" $tls.mountPath | quote }}
TXMQ_TLS_CLIENT_AUTH: {{ index $tls.clientAuth .component | quote }}
TXMQ_HEALTH_PORT: {{ $tls.healthPort | int | quote }}
{{- end }}
{{- end }}

{{/* The Secret volume of a component's certificate: (dict "root" $ "component" "broker"). */}}
{{- define "txmq.tlsVolume" -}}
{{- if .root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "txmq.tlsSecretName" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* Its mount (no subPath: Kubernetes updates the files in place when the Secret changes). */}}
{{- define "txmq.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The plaintext health-only port the probes use with TLS on (a container port entry). */}}
{{- define "txmq.healthContainerPort" -}}
{{- if .Values.tls.enabled }}
- name: health
  containerPort: {{ .Values.tls.healthPort }}
  protocol: TCP
{{- end }}
{{- end }}

{{/*
Authentication (auth.enabled): the credential files and the component's own token, mounted
from Secrets as directories (never subPath: a Secret update then reaches the running pod,
and the services reload the files). The chart's generated file (service identities, admin,
auth.clients) always; the operator's auth.credentials beside it when named. Access keys
(HMAC secrets) go to the proxy only. (dict "root" $ "component" "broker")
*/}}
{{- define "txmq.authGeneratedName" -}}
{{- printf "%s-auth" (include "txmq.fullname" .) }}
{{- end }}

{{- define "txmq.accessKeysGeneratedName" -}}
{{- include "txmq.componentName" (dict "root" . "component" "proxy-access-keys") }}
{{- end }}

{{/* The Secret holding a component's own token: the operator's, else the generated one. */}}
{{- define "txmq.tokenSecretName" -}}
{{- index .root.Values.auth.serviceTokens.secretNames .component | default (include "txmq.componentName" (dict "root" .root "component" (printf "%s-token" .component))) }}
{{- end }}

{{- define "txmq.authEnv" -}}
{{- $a := .root.Values.auth }}
{{- if $a.enabled }}
{{- $files := list "/etc/txmq/auth/generated/credentials.yaml" }}
{{- if $a.credentials.secretName }}
{{- $files = append $files (printf "/etc/txmq/auth/credentials/%s" $a.credentials.key) }}
{{- end }}
{{- if eq .component "proxy" }}
{{- $files = append $files "/etc/txmq/auth/generated-access-keys/access-keys.yaml" }}
{{- if $a.accessKeys.secretName }}
{{- $files = append $files (printf "/etc/txmq/auth/access-keys/%s" $a.accessKeys.key) }}
{{- end }}
{{- end }}
- name: TXMQ_AUTH_FILES
  value: {{ join "," $files | quote }}
- name: TXMQ_AUTH_TOKEN_FILE
  value: {{ printf "/etc/txmq/auth/token/%s" $a.serviceTokens.key }}
{{- else }}
# auth.enabled false: no authentication, every call allowed.
- name: TXMQ_AUTH_FILES
  value: ""
- name: TXMQ_AUTH_TOKEN_FILE
  value: ""
{{- end }}
- name: TXMQ_AUTH_RELOAD_SECONDS
  value: {{ include "txmq.settingValue" $a.reloadSeconds | quote }}
{{- end }}

{{- define "txmq.authMounts" -}}
{{- $a := .root.Values.auth }}
{{- if $a.enabled }}
- name: auth-generated
  mountPath: /etc/txmq/auth/generated
  readOnly: true
{{- if $a.credentials.secretName }}
- name: auth-credentials
  mountPath: /etc/txmq/auth/credentials
  readOnly: true
{{- end }}
- name: auth-token
  mountPath: /etc/txmq/auth/token
  readOnly: true
{{- if eq .component "proxy" }}
- name: auth-generated-access-keys
  mountPath: /etc/txmq/auth/generated-access-keys
  readOnly: true
{{- if $a.accessKeys.secretName }}
- name: auth-access-keys
  mountPath: /etc/txmq/auth/access-keys
  readOnly: true
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "txmq.authVolumes" -}}
{{- $a := .root.Values.auth }}
{{- if $a.enabled }}
- name: auth-generated
  secret:
    secretName: {{ include "txmq.authGeneratedName" .root }}
    defaultMode: 0400
{{- if $a.credentials.secretName }}
- name: auth-credentials
  secret:
    secretName: {{ $a.credentials.secretName }}
    defaultMode: 0400
{{- end }}
- name: auth-token
  secret:
    secretName: {{ include "txmq.tokenSecretName" . }}
    defaultMode: 0400
{{- if eq .component "proxy" }}
- name: auth-generated-access-keys
  secret:
    secretName: {{ include "txmq.accessKeysGeneratedName" .root }}
    defaultMode: 0400
{{- if $a.accessKeys.secretName }}
- name: auth-access-keys
  secret:
    secretName: {{ $a.accessKeys.secretName }}
    defaultMode: 0400
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The label a client pod carries to reach the release's ports: "<fullname>-client". */}}
{{- define "txmq.clientLabel" -}}
{{- printf "%s-client" (include "txmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A NetworkPolicy of one component (networkPolicy.enabled): its gRPC port from the peers
given (clients; nobody else reaches other ports), /metrics only from the monitoring
namespace. (dict "root" $ "component" "proxy" "port" 8081)
*/}}
{{- define "txmq.networkPolicy" -}}
{{- $np := .root.Values.networkPolicy }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "txmq.componentName" . }}
  labels:
    {{- include "txmq.labels" (dict "root" .root "component" .component) | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "txmq.selectorLabels" (dict "root" .root "component" .component) | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    - ports:
        - port: {{ .port }}
          protocol: TCP
      {{- if not $np.allowExternal }}
      from:
        # txmq's own pods (services call each other on these ports).
        - podSelector:
            matchLabels:
              {{- include "txmq.selectorLabels" (dict "root" $.root) | nindent 14 }}
        # Client pods of this namespace that carry the client label.
        - podSelector:
            matchLabels:
              {{ include "txmq.clientLabel" .root }}: "true"
        {{- with $np.clients }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    - ports:
        - port: {{ .root.Values.metrics.port }}
          protocol: TCP
      from:
        - namespaceSelector:
            matchLabels:
              {{- toYaml $np.monitoringNamespaceLabels | nindent 14 }}
{{- end }}

{{/*
What every container of the topics Job shares: the name server, the admin credential
(token and, with TLS, its client certificate), resources and the locked-down context.
(dict "root" $ "nameserver" "host:port" "tlsMode" "generated")
*/}}
{{- define "txmq.topicsJobContainer" -}}
env:
  - name: TXMQ_NAMESERVER
    value: {{ .nameserver | quote }}
  {{- if .root.Values.auth.enabled }}
  - name: TXMQ_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ include "txmq.componentName" (dict "root" .root "component" "admin") }}
        key: token
  {{- end }}
  {{- if ne .tlsMode "off" }}
  - name: TXMQ_TLS_CA_FILE
    value: {{ printf "%s/ca.crt" .root.Values.tls.mountPath | quote }}
  - name: TXMQ_TLS_CERT_FILE
    value: {{ printf "%s/tls.crt" .root.Values.tls.mountPath | quote }}
  - name: TXMQ_TLS_KEY_FILE
    value: {{ printf "%s/tls.key" .root.Values.tls.mountPath | quote }}
  {{- end }}
{{- with .root.Values.topicsJob.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "txmq.containerSecurityContext" .root }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
  {{- if ne .tlsMode "off" }}
  - name: tls
    mountPath: {{ .root.Values.tls.mountPath }}
    readOnly: true
  {{- end }}
{{- end }}

{{/* The checker's TXMQ_RESOLVER_GROUPS: GROUP=FILE for each checker.resolver.groups entry,
the file its Secret's key is mounted as (the checker's statefulset mounts them). */}}
{{- define "txmq.resolverGroups" -}}
{{- $out := list }}
{{- range $i, $g := .resolver.groups }}
{{- $out = append $out (printf "%s=/etc/txmq/resolver/%d/dsn" $g.group $i) }}
{{- end }}
{{- join "," $out }}
{{- end }}
