{{/* Names and labels shared by every template. */}}

{{- define "nexus-admit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nexus-admit.fullname" -}}
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

{{- define "nexus-admit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nexus-admit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nexus-admit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "nexus-admit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nexus-admit.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nexus-admit.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "nexus-admit.certSecretName" -}}
{{- printf "%s-webhook-cert" (include "nexus-admit.fullname" .) }}
{{- end }}

{{- define "nexus-admit.serviceName" -}}
{{- include "nexus-admit.fullname" . }}
{{- end }}

{{- define "nexus-admit.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* "true" when a MutatingAdmissionPolicy adds the scheduling gate (webhook.gateMode). */}}
{{- define "nexus-admit.gateByPolicy" -}}
{{- $mode := .Values.webhook.gateMode | default "auto" }}
{{- if or (eq $mode "policy") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")) }}true{{ end }}
{{- end }}

{{/* The ConfigMap of queues the queue gate policy reads and the controller writes. */}}
{{- define "nexus-admit.gatedQueuesConfigMap" -}}
{{- printf "%s-gated-queues" (include "nexus-admit.fullname" .) }}
{{- end }}

{{/* The namespaces whose pods the webhook and the gate policy see. */}}
{{- define "nexus-admit.podNamespaceSelector" -}}
{{- if .Values.webhook.namespaceSelector }}
{{- toYaml .Values.webhook.namespaceSelector }}
{{- else }}
matchExpressions:
- key: kubernetes.io/metadata.name
  operator: NotIn
  values:
  {{- range (append .Values.webhook.excludedNamespaces .Release.Namespace | uniq) }}
  - {{ . }}
  {{- end }}
{{- end }}
{{- end }}
