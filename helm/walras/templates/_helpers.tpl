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

{{/* The leader Lease's name (walras run --peering): derived from the release, so two releases (even in one namespace)
never compete for the same Lease; peering.name overrides. */}}
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

{{/* The address the extender listens on: extender.host, else 127.0.0.1, else 0.0.0.0 when the chart's own scheduler (a
separate Deployment, reaching the leader through the Service) must call it over the pod network. */}}
{{- define "walras.extenderHost" -}}
{{- if .Values.extender.host -}}
{{- .Values.extender.host -}}
{{- else if .Values.scheduler.enabled -}}
0.0.0.0
{{- else -}}
127.0.0.1
{{- end -}}
{{- end -}}

{{/* "true" when the extender listens on loopback only (unreachable from outside its pod). */}}
{{- define "walras.extenderLoopback" -}}
{{- if has (include "walras.extenderHost" .) (list "127.0.0.1" "::1" "localhost") -}}true{{- end -}}
{{- end -}}

{{/* "true" when the extender demands client certificates (mutual TLS). */}}
{{- define "walras.extenderMutualTLS" -}}
{{- if and .Values.extender.tls.enabled .Values.extender.tls.clientCA -}}true{{- end -}}
{{- end -}}

{{/* Fails rendering on value combinations that cannot work or would expose the extender. */}}
{{- define "walras.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.peering.enabled) -}}
{{- fail "operator.replicas > 1 needs peering.enabled=true: without the leader Lease two replicas would both act" -}}
{{- end -}}
{{- if and .Values.scheduler.enabled (ne .Values.operator.mode "extender") -}}
{{- fail "scheduler.enabled=true needs operator.mode=extender: in direct mode the operator binds and the extender is unused" -}}
{{- end -}}
{{- if and .Values.extender.tls.enabled (not .Values.extender.tls.secretName) -}}
{{- fail "extender.tls.enabled=true needs extender.tls.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.scheduler.enabled (include "walras.extenderLoopback" .) -}}
{{- fail "scheduler.enabled=true cannot reach an extender on loopback (extender.host): the chart's scheduler is a separate Deployment; leave extender.host empty" -}}
{{- end -}}
{{- if and (not (include "walras.extenderLoopback" .)) (not (include "walras.extenderMutualTLS" .)) -}}
{{- fail (printf "the extender listens on %s (beyond loopback) and needs mutual TLS: set extender.tls.enabled=true, extender.tls.secretName and extender.tls.clientCA (and scheduler.extender.clientCertSecretName for the chart's scheduler); see docs/install.md" (include "walras.extenderHost" .)) -}}
{{- end -}}
{{- if and .Values.scheduler.enabled (include "walras.extenderMutualTLS" .) (not .Values.scheduler.extender.clientCertSecretName) -}}
{{- fail "the extender demands client certificates (extender.tls.clientCA): scheduler.extender.clientCertSecretName must name the scheduler's kubernetes.io/tls Secret" -}}
{{- end -}}
{{- $budget := .Values.podDisruptionBudget -}}
{{- if and $budget.enabled (gt (int .Values.operator.replicas) 1) -}}
{{- $short := false -}}
{{- if kindIs "string" $budget.maxUnavailable -}}
{{- $short = lt (int (trimSuffix "%" $budget.maxUnavailable)) 100 -}}
{{- else -}}
{{- $short = lt (int $budget.maxUnavailable) (int .Values.operator.replicas) -}}
{{- end -}}
{{- if $short -}}
{{- fail "podDisruptionBudget.maxUnavailable must be >= operator.replicas (or 100%): only the leader is Ready, so a smaller budget never allows evicting it (node drains hang)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
