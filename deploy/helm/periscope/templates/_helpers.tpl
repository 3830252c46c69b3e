{{/*
Labels of every object: the ones deploy/ uses, plus Helm's standard four. Pod templates and selectors
carry only deploy/'s labels, so a chart upgrade alone restarts nothing.
Call with (dict "ctx" $ "component" "api"); component "" for objects of no single component.
*/}}
{{- define "periscope.labels" -}}
app.kubernetes.io/name: periscope
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
app.kubernetes.io/part-of: periscope
{{ include "periscope.helmLabels" .ctx }}
{{- end }}

{{- define "periscope.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "periscope.selector" -}}
app.kubernetes.io/name: periscope
app.kubernetes.io/component: {{ . }}
{{- end }}

{{- define "periscope.podLabels" -}}
{{ include "periscope.selector" . }}
app.kubernetes.io/part-of: periscope
{{- end }}

{{- define "periscope.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The shared settings (both copies of periscope-config hold the same data). */}}
{{- define "periscope.configData" -}}
{{- $k := .Values.kafka -}}
PERISCOPE_KAFKA_BOOTSTRAP: {{ $k.bootstrap | quote }}
PERISCOPE_LOG_LEVEL: {{ .Values.logLevel | quote }}
{{- if ne $k.securityProtocol "PLAINTEXT" }}
PERISCOPE_KAFKA_SECURITY_PROTOCOL: {{ $k.securityProtocol | quote }}
{{- end }}
{{- with $k.tls.caKey }}
PERISCOPE_KAFKA_SSL_CAFILE: {{ printf "/etc/periscope/kafka/%s" . | quote }}
{{- end }}
{{- with $k.tls.certKey }}
PERISCOPE_KAFKA_SSL_CERTFILE: {{ printf "/etc/periscope/kafka/%s" . | quote }}
{{- end }}
{{- with $k.tls.keyKey }}
PERISCOPE_KAFKA_SSL_KEYFILE: {{ printf "/etc/periscope/kafka/%s" . | quote }}
{{- end }}
{{- if not $k.tls.checkHostname }}
PERISCOPE_KAFKA_SSL_CHECK_HOSTNAME: "false"
{{- end }}
{{- if hasPrefix "SASL_" $k.securityProtocol }}
PERISCOPE_KAFKA_SASL_MECHANISM: {{ $k.sasl.mechanism | quote }}
{{- if not $k.perComponentPrincipals }}
PERISCOPE_KAFKA_SASL_USERNAME: {{ $k.sasl.username | quote }}
{{- end }}
PERISCOPE_KAFKA_SASL_PASSWORD_FILE: {{ printf "/etc/periscope/kafka/%s" $k.sasl.passwordKey | quote }}
{{- end }}
{{- end }}

{{/* Pods roll when the shared settings change: envFrom is read only when a container starts. */}}
{{- define "periscope.podAnnotations" -}}
checksum/config: {{ include "periscope.configData" . | sha256sum }}
{{- end }}

{{/* Whether the pods mount the Kafka credentials Secret: TLS files or a SASL password to read. */}}
{{- define "periscope.kafkaSecret" -}}
{{- $k := .Values.kafka -}}
{{- if or $k.tls.caKey $k.tls.certKey $k.tls.keyKey (hasPrefix "SASL_" $k.securityProtocol) -}}
true
{{- end -}}
{{- end }}

{{/* Container env that names this component's principal (only with kafka.perComponentPrincipals and SASL).
Call with (dict "ctx" $ "principal" "probe"). */}}
{{- define "periscope.principalEnv" -}}
{{- $k := .ctx.Values.kafka -}}
{{- if and $k.perComponentPrincipals (hasPrefix "SASL_" $k.securityProtocol) }}
- name: PERISCOPE_KAFKA_SASL_USERNAME
  value: {{ printf "periscope-%s" .principal | quote }}
{{- end }}
{{- end }}

{{- define "periscope.kafkaMount" -}}
{{- if include "periscope.kafkaSecret" .ctx }}
- name: kafka-credentials
  mountPath: /etc/periscope/kafka
  readOnly: true
{{- end }}
{{- end }}

{{/* Mounted as a directory (no subPath), so a rotated password reaches the file the clients re-read. */}}
{{- define "periscope.kafkaVolume" -}}
{{- $k := .ctx.Values.kafka -}}
{{- if include "periscope.kafkaSecret" .ctx }}
- name: kafka-credentials
  secret:
    secretName: {{ ternary (printf "%s-%s" $k.credentialsSecret .principal) $k.credentialsSecret $k.perComponentPrincipals }}
{{- end }}
{{- end }}

{{- define "periscope.containerSecurity" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "periscope.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "periscope.tmpVolume" -}}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- end }}

{{- define "periscope.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The probe's platform: kubelet root, GPU-node selection, RuntimeClass (docs/deploy.md). */}}
{{- define "periscope.kubeletRoot" -}}
{{- $roots := dict "microk8s" "/var/snap/microk8s/common/var/lib/kubelet" "k0s" "/var/lib/k0s/kubelet" -}}
{{- .Values.probe.kubeletRoot | default (get $roots .Values.platform) | default "/var/lib/kubelet" -}}
{{- end }}

{{- define "periscope.cloud" -}}
{{- if has .Values.platform (list "gke" "eks" "aks") }}true{{ end -}}
{{- end }}

{{/* What the schema cannot say: combinations of values. */}}
{{- define "periscope.validate" -}}
{{- $k := .Values.kafka -}}
{{- if ne (empty $k.tls.certKey) (empty $k.tls.keyKey) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together (mutual TLS needs the certificate and its key)" }}
{{- end }}
{{- if and (or $k.tls.caKey $k.tls.certKey) (not (has $k.securityProtocol (list "SSL" "SASL_SSL"))) }}
{{- fail (printf "kafka.tls keys are set but kafka.securityProtocol is %s: use SSL or SASL_SSL" $k.securityProtocol) }}
{{- end }}
{{- if and $k.perComponentPrincipals (eq $k.securityProtocol "PLAINTEXT") }}
{{- fail "kafka.perComponentPrincipals needs authentication: kafka.securityProtocol is PLAINTEXT" }}
{{- end }}
{{- if and (gt (int .Values.topics.minInsyncReplicas) (int .Values.topics.replicationFactor)) }}
{{- fail "topics.minInsyncReplicas is larger than topics.replicationFactor" }}
{{- end }}
{{- end }}

{{/* A component's NetworkPolicy (deploy/base): ingress on its own ports only (none: no ingress at all),
egress to DNS and Kafka by port (the Kafka port(s) of kafka.bootstrap) and, for the watcher and the API,
to the Kubernetes API, for the probe to the dcgm-exporter's port ("dcgm"). Call with (dict "ctx" $
"component" "joiner" "namespace" ns "ports" (list 9403) "apiserver" false); the API passes its own
ingress rule as "from" (a list of peers). */}}
{{- define "periscope.networkPolicy" -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: periscope-{{ .component }}
  namespace: {{ .namespace }}
  labels:
    {{- include "periscope.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "periscope.selector" .component | nindent 6 }}
  policyTypes: ["Ingress", "Egress"]
  {{- if .ports }}
  ingress:
    - ports:
        {{- range .ports }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
      {{- with .from }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  {{- end }}
  egress:
    - ports:
        - port: 53
          protocol: UDP
        - port: 53
          protocol: TCP
    - ports:
        {{- range $port := include "periscope.kafkaPorts" .ctx | fromJsonArray }}
        - port: {{ $port }}
          protocol: TCP
        {{- end }}
    {{- if .dcgm }}
    # the node's dcgm-exporter (probe.dcgmExporterUrl), by port
    - ports:
        - port: {{ .dcgm }}
          protocol: TCP
    {{- end }}
    {{- if .apiserver }}
    - ports:
        - port: 443
          protocol: TCP
        - port: 6443
          protocol: TCP
        - port: 16443
          protocol: TCP
    {{- end }}
{{- end }}

{{/* The distinct ports of kafka.bootstrap (host:port[,host:port...]), as a JSON list of numbers. */}}
{{- define "periscope.kafkaPorts" -}}
{{- $ports := list -}}
{{- range splitList "," .Values.kafka.bootstrap -}}
{{- $ports = append $ports (int (last (splitList ":" (trim .)))) -}}
{{- end -}}
{{- $ports | uniq | toJson -}}
{{- end }}
