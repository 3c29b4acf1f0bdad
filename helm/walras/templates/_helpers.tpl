{{/* Names, labels and small computed values shared by the templates. */}}

{{- define "walras.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "walras.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "walras.schedulerFullname" -}}
{{- printf "%s-scheduler" (include "walras.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "walras.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "walras.labels" -}}
helm.sh/chart: {{ include "walras.chart" . }}
{{ include "walras.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: walras
{{- end -}}

{{- define "walras.selectorLabels" -}}
app.kubernetes.io/name: {{ include "walras.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "walras.schedulerLabels" -}}
helm.sh/chart: {{ include "walras.chart" . }}
{{ include "walras.schedulerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: walras
{{- end -}}

{{- define "walras.schedulerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "walras.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "walras.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "walras.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The ClusterKopfPeering's name: cluster-scoped, so derived from the release (two releases never share it). */}}
{{- define "walras.peeringName" -}}
{{- default (include "walras.fullname" .) .Values.peering.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "walras.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The extender's URL prefix as the second scheduler sees it: the Service's cluster DNS name. */}}
{{- define "walras.extenderURLPrefix" -}}
{{- $scheme := ternary "https" "http" .Values.extender.tls.enabled -}}
{{- printf "%s://%s.%s.svc:%d/scheduler" $scheme (include "walras.fullname" .) .Release.Namespace (int .Values.operator.ports.extender) -}}
{{- end -}}

{{/* Fails rendering on value combinations that cannot work. */}}
{{- define "walras.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.peering.enabled) -}}
{{- fail "operator.replicas > 1 needs peering.enabled=true: without kopf peering two replicas would both act" -}}
{{- end -}}
{{- if and .Values.scheduler.enabled (ne .Values.operator.mode "extender") -}}
{{- fail "scheduler.enabled=true needs operator.mode=extender: in direct mode the operator binds and the extender is unused" -}}
{{- end -}}
{{- if and .Values.extender.tls.enabled (not .Values.extender.tls.secretName) -}}
{{- fail "extender.tls.enabled=true needs extender.tls.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- end -}}
