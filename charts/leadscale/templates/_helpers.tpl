{{/* Names, labels and small derived values shared by the templates. */}}

{{- define "leadscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "leadscale.fullname" -}}
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

{{- define "leadscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leadscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "leadscale.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "leadscale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: keda-external-scaler
{{- end -}}

{{- define "leadscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "leadscale.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret the scaler's TLS material comes from. */}}
{{- define "leadscale.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "leadscale.fullname" .) -}}
{{- else -}}
{{- required "tls.enabled needs tls.existingSecret or tls.certManager.enabled" .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* Where the ScaledObject lives. */}}
{{- define "leadscale.scaledObjectNamespace" -}}
{{- default .Release.Namespace .Values.scaledObject.namespace -}}
{{- end -}}

{{/* The Secret KEDA reads caCert (and its client certificate) from. */}}
{{- define "leadscale.kedaClientSecret" -}}
{{- if .Values.scaledObject.authentication.secretName -}}
{{- .Values.scaledObject.authentication.secretName -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- printf "%s-keda-client" (include "leadscale.fullname" .) -}}
{{- else -}}
{{- fail "scaledObject with tls.enabled needs scaledObject.authentication.secretName (a Secret with ca.crt, and tls.crt/tls.key for mTLS) or tls.certManager.enabled" -}}
{{- end -}}
{{- end -}}

{{/* host:port KEDA dials: the Service's cluster DNS name. */}}
{{- define "leadscale.scalerAddress" -}}
{{- printf "%s.%s.svc.cluster.local:%d" (include "leadscale.fullname" .) .Release.Namespace (int .Values.scaler.grpcPort) -}}
{{- end -}}

{{/* Every DNS name the server certificate must carry. */}}
{{- define "leadscale.dnsNames" -}}
{{- $name := include "leadscale.fullname" . -}}
- {{ $name }}
- {{ $name }}.{{ .Release.Namespace }}
- {{ $name }}.{{ .Release.Namespace }}.svc
- {{ $name }}.{{ .Release.Namespace }}.svc.cluster.local
{{- range .Values.tls.certManager.extraDnsNames }}
- {{ . }}
{{- end }}
{{- end -}}

{{/* Namespaces that get a Role when rbac.clusterWide is false. */}}
{{- define "leadscale.rbacNamespaces" -}}
{{- $list := .Values.rbac.namespaces -}}
{{- if not $list -}}
{{- $list = list .Release.Namespace -}}
{{- if and .Values.scaledObject.enabled (ne (include "leadscale.scaledObjectNamespace" .) .Release.Namespace) -}}
{{- $list = append $list (include "leadscale.scaledObjectNamespace" .) -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $list) -}}
{{- end -}}

{{/* "true" when /metrics and /decisions listen on loopback only (nothing outside the pod reaches them). */}}
{{- define "leadscale.metricsInPod" -}}
{{- $host := .Values.scaler.metricsHost | default .Values.scaler.host -}}
{{- if or (hasPrefix "127." $host) (eq $host "::1") (eq $host "localhost") -}}true{{- end -}}
{{- end -}}
