{{/* The notes `helm install` and `helm upgrade` print (NOTES.txt); a define, so tests can render them
without a cluster. */}}
{{- define "periscope.notes" -}}
{{- $ns := .Values.namespaces.main -}}
{{- $tls := .Values.api.tls.enabled -}}
{{- $scheme := ternary "https" "http" $tls -}}
Periscope {{ .Chart.AppVersion }} is installed: the probe in namespace {{ .Values.namespaces.node }}, the
watcher, joiner and API in namespace {{ $ns }}. The topics Job ran before this message (it is a hook).

1. Check that everything runs:
     kubectl -n {{ .Values.namespaces.node }} rollout status daemonset/periscope-probe
     kubectl -n {{ $ns }} rollout status deployment/periscope-kube-watcher deployment/periscope-joiner deployment/periscope-api
   The probe runs on GPU nodes only; `kubectl -n {{ .Values.namespaces.node }} exec POD -- periscope doctor`
   tells what a node offers it.
{{- if $tls }}

2. The API serves HTTPS with the key pair of the Secret {{ .Values.api.tls.secretName }} in {{ $ns }}; its pods
   do not start until that Secret exists (docs/deploy.md, "The API's TLS certificate").
{{- end }}

{{ ternary "3" "2" $tls }}. Reach the API and the web view (the Service is ClusterIP):
     kubectl -n {{ $ns }} port-forward svc/periscope-api 8080:8080
{{- if eq .Values.api.auth "kubernetes" }}
     TOKEN=$(kubectl create token default)      # any token the apiserver accepts
     curl {{ if $tls }}--cacert tls.crt {{ end }}-H "Authorization: Bearer $TOKEN" {{ $scheme }}://localhost:8080/v1/pods?namespace=default
   Web view: open {{ $scheme }}://localhost:8080/#token=TOKEN in a browser.
   Terminal: PERISCOPE_API_TOKEN=$TOKEN periscope top --api {{ $scheme }}://localhost:8080
   A caller sees the namespaces where it may `list pods`; the ClusterRoles periscope-namespace-viewer
   and periscope-cluster-viewer are examples to bind (docs/deploy.md, "Who may read what").
{{- else }}
     curl {{ if $tls }}--cacert tls.crt {{ end }}{{ $scheme }}://localhost:8080/v1/pods?namespace=default
   Web view: open {{ $scheme }}://localhost:8080/ in a browser.
   Terminal: periscope top --api {{ $scheme }}://localhost:8080
   WARNING: api.auth=none: anyone who reaches the port reads every namespace.
{{- end }}
{{- if .Values.monitoring.enabled }}

Monitoring: the ServiceMonitor periscope-api, the PrometheusRule periscope and the dashboard ConfigMap
periscope-grafana-dashboard are in {{ $ns }}; your Prometheus must select them (monitoring.labels).
{{- end }}
{{- end }}
