{{/* The name every object of the release is given. */}}
{{- define "mcc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "mcc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: multicluster-runtime
{{ include "mcc.selectorLabels" . }}
{{- end -}}

{{/* What selects the release's pods. */}}
{{- define "mcc.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Whether the provider reads its inventory in the release's namespace. */}}
{{- define "mcc.namespacedInventory" -}}
{{- if has .Values.provider (list "kubeconfig" "cluster-api" "cluster-inventory-api") -}}true{{- end -}}
{{- end -}}

{{/* Refuses values the chart cannot honour, naming them. */}}
{{- define "mcc.validate" -}}
{{- if not (has .Values.provider (list "kubeconfig" "cluster-api" "cluster-inventory-api" "namespace")) -}}
{{- fail (printf "provider %q is not one of kubeconfig, cluster-api, cluster-inventory-api, namespace" .Values.provider) -}}
{{- end -}}
{{- if not (has .Values.mode (list "leaderElection" "sharding" "single")) -}}
{{- fail (printf "mode %q is not one of leaderElection, sharding, single" .Values.mode) -}}
{{- end -}}
{{- end -}}
