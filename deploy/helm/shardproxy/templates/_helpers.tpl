{{/*
shardproxy.labels: the labels of every object's metadata: the overlays' part-of label,
and Helm's own two (deploy/helm's test ignores those when it compares the chart with the
overlays).
*/}}
{{- define "shardproxy.labels" -}}
app.kubernetes.io/part-of: shardproxy
{{ include "shardproxy.helmLabels" . }}
{{- end -}}

{{/* shardproxy.helmLabels: Helm's own labels alone (the monitoring objects, which the overlays' Component adds without the part-of label). */}}
{{- define "shardproxy.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* shardproxy.image: the image, by digest when one is given, else by tag. */}}
{{- define "shardproxy.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* shardproxy.replace: "true" in replace mode; fails on an unknown mode. */}}
{{- define "shardproxy.replace" -}}
{{- if eq .Values.mode "replace" -}}
{{- if not .Values.apiServer.host -}}
{{- fail "mode replace needs apiServer.host: the supervisor must reach kube-apiserver without a Service (values.yaml, apiServer)" -}}
{{- end -}}
true
{{- else if ne .Values.mode "alongside" -}}
{{- fail (printf "mode %q: want alongside or replace" .Values.mode) -}}
{{- end -}}
{{- end -}}

{{/*
shardproxy.configMap: the supervisor configuration as a dict: the mode's node-wide
settings (those of the overlay's config.yaml), otherNodeAddresses: published when the
chart runs the node address writer, .Values.config over them, and the instances (the
mode's one when .Values.instances is empty).
*/}}
{{- define "shardproxy.configMap" -}}
{{- $c := dict "apiVersion" "shardproxy.io/v1alpha1" "kind" "SupervisorConfig" -}}
{{- $_ := set $c "conntrack" (dict "maxPerCore" 0 "tcpEstablishedTimeout" "0s" "tcpCloseWaitTimeout" "0s") -}}
{{- $instances := .Values.instances -}}
{{- if include "shardproxy.replace" . -}}
{{- $_ := set $c "healthzBindAddress" "0.0.0.0:10256" -}}
{{- $_ := set $c "metricsBindAddress" "127.0.0.1:10249" -}}
{{- $_ := set $c "masqueradeBit" 14 -}}
{{- if not $instances -}}
{{- $instances = list (dict "name" "default" "default" true "slot" 0 "detectLocal" (dict "mode" "NodeCIDR")) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $c "healthzBindAddress" "0.0.0.0:10356" -}}
{{- $_ := set $c "metricsBindAddress" "127.0.0.1:10349" -}}
{{- $_ := set $c "masqueradeBit" 13 -}}
{{- if not $instances -}}
{{- $instances = list (dict "name" "migration" "proxyNames" (list "shardproxy") "slot" 0 "tenant" (dict "namespaces" (list "default")) "detectLocal" (dict "mode" "NodeCIDR")) -}}
{{- end -}}
{{- end -}}
{{- if include "shardproxy.nodeAddresses" . -}}
{{- $_ := set $c "otherNodeAddresses" "published" -}}
{{- end -}}
{{- $c = mergeOverwrite $c (deepCopy .Values.config) -}}
{{- $_ := set $c "instances" $instances -}}
{{- toYaml $c -}}
{{- end -}}

{{/* shardproxy.configName: the ConfigMap's name, with a hash of the configuration (as kustomize's configMapGenerator names it), so that a change rolls the DaemonSet. */}}
{{- define "shardproxy.configName" -}}
shardproxy-config-{{ include "shardproxy.configMap" . | sha256sum | trunc 10 }}
{{- end -}}

{{/* shardproxy.port: the port of a bind address ("0.0.0.0:10256", "[::]:10256"). */}}
{{- define "shardproxy.port" -}}
{{- splitList ":" . | last -}}
{{- end -}}

{{/* shardproxy.statusNamespace: where the node statuses live ("" when turned off). */}}
{{- define "shardproxy.statusNamespace" -}}
{{- $ns := .Values.config.statusNamespace | default "shardproxy-system" -}}
{{- if ne $ns "-" -}}{{ $ns }}{{- end -}}
{{- end -}}

{{/*
shardproxy.nodeAddresses: "true" when the chart runs the node address writer. The values
of a release installed by an older chart lack nodeAddresses (`helm upgrade
--reuse-values` keeps them, not this chart's defaults): off.
*/}}
{{- define "shardproxy.nodeAddresses" -}}
{{- if (.Values.nodeAddresses | default dict).enabled -}}true{{- end -}}
{{- end -}}

{{/* shardproxy.nodeAddressesNamespace: where the node address writer runs and writes the list: the statusNamespace ("" when the writer is off; fails when the node statuses are turned off). */}}
{{- define "shardproxy.nodeAddressesNamespace" -}}
{{- if include "shardproxy.nodeAddresses" . -}}
{{- $ns := include "shardproxy.statusNamespace" . -}}
{{- if not $ns -}}
{{- fail "nodeAddresses.enabled needs config.statusNamespace: the writer publishes the list there and the supervisors read it there (not \"-\")" -}}
{{- end -}}
{{- $ns -}}
{{- end -}}
{{- end -}}
