{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "kds.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fully qualified app name. Kept to 52 characters: StatefulSet pods add "-<ordinal>" and the
controller-revision-hash label adds 11 more characters to the StatefulSet name.
*/}}
{{- define "kds.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kds.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kds.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kds.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kds.labels" -}}
helm.sh/chart: {{ include "kds.chart" . }}
{{ include "kds.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: delay-sidecar
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kds.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kds.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kds.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Fixed paths inside the container (the image's defaults). */}}
{{- define "kds.dataDir" -}}/var/lib/delay-sidecar{{- end -}}
{{- define "kds.configDir" -}}/etc/delay-sidecar{{- end -}}

{{/*
A sidecar duration (250ms, 5s, 1m, 2h, 1d, or bare milliseconds) in whole seconds, rounded up.
*/}}
{{- define "kds.durationSeconds" -}}
{{- $s := . | toString | trim -}}
{{- $n := regexFind "^[0-9]+" $s | int64 -}}
{{- $unit := regexReplaceAll "^[0-9]+\\s*" $s "" -}}
{{- $ms := $n -}}
{{- if eq $unit "s" -}}{{- $ms = mul $n 1000 -}}
{{- else if eq $unit "m" -}}{{- $ms = mul $n 60000 -}}
{{- else if eq $unit "h" -}}{{- $ms = mul $n 3600000 -}}
{{- else if eq $unit "d" -}}{{- $ms = mul $n 86400000 -}}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}

{{/*
Checks the schema cannot express; fails the render with a message naming the value.
*/}}
{{- define "kds.validate" -}}
{{- include "kds.validateTenants" . -}}
{{- $bootstrap := .Values.config.bootstrapServers | default "" | toString | trim -}}
{{- if not $bootstrap -}}
{{- fail "config.bootstrapServers is required: the Kafka bootstrap servers (host:port[,host:port...]) of the cluster the sidecar runs beside" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) -}}
{{- fail "tls.enabled=true needs tls.existingSecret: a Secret with the CA certificate (key tls.caKey) and, for tls.clientAuth, tls.certKey and tls.keyKey" -}}
{{- end -}}
{{- if and .Values.sasl.enabled (not .Values.sasl.existingSecret) -}}
{{- fail "sasl.enabled=true needs sasl.existingSecret: a Secret with the SASL username (key sasl.usernameKey) and password (key sasl.passwordKey)" -}}
{{- end -}}
{{- range $k, $v := .Values.kafka -}}
{{- if regexMatch "(?i)(password|secret|jaas|key\\.pem|token\\.value)" $k -}}
{{- fail (printf "kafka.%s looks like a secret and would land in the ConfigMap: put it in a Secret and pass it as env DELAY_SIDECAR_KAFKA_%s (extraEnv with valueFrom.secretKeyRef), or use sasl.existingSecret" $k ($k | upper | replace "." "_")) -}}
{{- end -}}
{{- end -}}
{{- $shutdown := include "kds.durationSeconds" (.Values.config.shutdownTimeout | default "30s") | int64 -}}
{{- if le (int64 .Values.terminationGracePeriodSeconds) $shutdown -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed config.shutdownTimeout (%v = %ds), or Kubernetes kills the sidecar before its graceful shutdown ends" .Values.terminationGracePeriodSeconds .Values.config.shutdownTimeout $shutdown) -}}
{{- end -}}
{{- if and (eq (int .Values.replicaCount) 1) .Values.podDisruptionBudget.enabled (hasKey .Values.podDisruptionBudget "minAvailable") -}}
{{- if ge (int .Values.podDisruptionBudget.minAvailable) 1 -}}
{{- fail "podDisruptionBudget.minAvailable >= 1 with replicaCount 1 blocks every node drain; use maxUnavailable" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* librdkafka properties the chart derives from tls and sasl, then the user's `kafka` map. */}}
{{- define "kds.kafkaProperties" -}}
{{- $props := dict -}}
{{- if and .Values.tls.enabled .Values.sasl.enabled -}}
{{- $_ := set $props "security.protocol" "SASL_SSL" -}}
{{- else if .Values.tls.enabled -}}
{{- $_ := set $props "security.protocol" "SSL" -}}
{{- else if .Values.sasl.enabled -}}
{{- $_ := set $props "security.protocol" "SASL_PLAINTEXT" -}}
{{- end -}}
{{- if .Values.sasl.enabled -}}
{{- $_ := set $props "sasl.mechanism" .Values.sasl.mechanism -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $props "ssl.ca.location" (printf "%s/%s" .Values.tls.mountPath .Values.tls.caKey) -}}
{{- if .Values.tls.clientAuth -}}
{{- $_ := set $props "ssl.certificate.location" (printf "%s/%s" .Values.tls.mountPath .Values.tls.certKey) -}}
{{- $_ := set $props "ssl.key.location" (printf "%s/%s" .Values.tls.mountPath .Values.tls.keyKey) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.kafka -}}
{{- if not (kindIs "invalid" $v) -}}
{{- if kindIs "string" $v -}}
{{- $_ := set $props $k $v -}}
{{- else -}}
{{- $_ := set $props $k (toJson $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $props -}}
{{- end -}}

{{/*
The sidecar's config file: the `config` options (camelCase -> flag names) + chart-managed keys.
`changelog: on` unquoted is a YAML boolean here; the sidecar wants the word (toYaml quotes it).
*/}}
{{- define "kds.configFile" -}}
{{- $doc := dict -}}
{{- range $k, $v := .Values.config -}}
{{- if not (kindIs "invalid" $v) -}}
{{- if and (eq $k "changelog") (kindIs "bool" $v) -}}
{{- $v = ternary "on" "off" $v -}}
{{- end -}}
{{- $_ := set $doc (kebabcase $k) $v -}}
{{- end -}}
{{- end -}}
{{- $tenants := include "kds.tenantsConfig" . | fromYaml -}}
{{- if $tenants -}}
{{- $_ := unset $doc "ingress-topic" -}}{{/* each tenant names its own */}}
{{- $_ := set $doc "tenants" $tenants -}}
{{- end -}}
{{- $_ := set $doc "data-dir" (include "kds.dataDir" .) -}}
{{- $_ := set $doc "http-host" "0.0.0.0" -}}
{{- $_ := set $doc "http-port" (int .Values.http.port) -}}
{{- $kafka := include "kds.kafkaProperties" . | fromYaml -}}
{{- if $kafka -}}
{{- $_ := set $doc "kafka" $kafka -}}
{{- end -}}
{{- toYaml $doc -}}
{{- end -}}

{{/*
Bytes of a Kubernetes quantity (persistence.size: 10Gi, 500M, 1.5Ti; suffixes are case-sensitive,
as in Kubernetes), as a decimal integer string.
*/}}
{{- define "kds.quantityBytes" -}}
{{- $s := . | toString | trim -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $s -}}
{{- $unit := trimPrefix $num $s -}}
{{- $mult := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "P" 1000000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "Pi" 1125899906842624 -}}
{{- if or (not $num) (not (hasKey $mult $unit)) -}}
{{- fail (printf "%q is not a volume size this chart understands (e.g. 10Gi, 500M, 1.5Ti)" $s) -}}
{{- end -}}
{{- printf "%.0f" (mulf $num (get $mult $unit)) -}}
{{- end -}}

{{/*
Bytes of a sidecar size (config.diskMaxBytes: 1048576, 64MiB, 10GB; units case-insensitive, as in
sidecar/durations.py), as a decimal integer string.
*/}}
{{- define "kds.sizeBytes" -}}
{{- $s := . | toString | trim -}}
{{- $num := regexFind "^[0-9]+" $s -}}
{{- $unit := trimPrefix $num $s | trim | lower -}}
{{- $mult := dict "" 1 "b" 1 "k" 1000 "kb" 1000 "m" 1000000 "mb" 1000000 "g" 1000000000 "gb" 1000000000 "t" 1000000000000 "tb" 1000000000000 "kib" 1024 "mib" 1048576 "gib" 1073741824 "tib" 1099511627776 -}}
{{- if or (not $num) (not (hasKey $mult $unit)) -}}
{{- fail (printf "%q is not a size (e.g. 1048576, 64MiB, 10GB)" $s) -}}
{{- end -}}
{{- printf "%.0f" (mulf $num (get $mult $unit)) -}}
{{- end -}}

{{/*
The bytes the store may fill before the sidecar pauses ingress: the volume (persistence.size) or
config.diskMaxBytes, whichever is smaller; "" when neither bounds it (emptyDir and no limit).
*/}}
{{- define "kds.storeCapacityBytes" -}}
{{- $cap := "" -}}
{{- if .Values.persistence.enabled -}}
{{- $cap = include "kds.quantityBytes" .Values.persistence.size -}}
{{- end -}}
{{- $max := .Values.config.diskMaxBytes | default 0 -}}
{{- if $max -}}
{{- $limit := include "kds.sizeBytes" $max -}}
{{- if and (ne $limit "0") (or (not $cap) (lt (float64 $limit) (float64 $cap))) -}}
{{- $cap = $limit -}}
{{- end -}}
{{- end -}}
{{- $cap -}}
{{- end -}}
