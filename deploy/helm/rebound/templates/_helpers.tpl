{{/* The image reference: by digest when one is given, else by tag. */}}
{{- define "rebound.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "rebound.labels" -}}
app.kubernetes.io/name: rebound
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "rebound.selector" -}}
app.kubernetes.io/name: rebound
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rebound.secretName" -}}
{{ .Values.amqp.existingSecret | default "rebound-amqp" }}
{{- end -}}

{{/* The console's own name, so that no selector of the retrier's (Deployment,
PodDisruptionBudget, Service) takes the console's pod. */}}
{{- define "rebound.consoleSelector" -}}
app.kubernetes.io/name: rebound-console
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rebound.consoleLabels" -}}
{{ include "rebound.consoleSelector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
