{{/*
Tenants (values `tenants`): the config file's `tenants:` mapping, and the Secrets that hold each
tenant principal's credentials.

A tenant with `credentials` gets its Secret's username and password projected into the config
volume at <configDir>/tenants/<name>/username and .../password (the "config" volume becomes a
projected volume of the ConfigMap and those Secrets: one mount, nothing nested in a read-only
ConfigMap mount), and its `kafka:` names those files in the sidecar's {file: path} form, so no
secret passes through the ConfigMap or the environment.
*/}}

{{/* The directory a tenant's credential files are projected to. */}}
{{- define "kds.tenantDir" -}}
{{- printf "%s/tenants/%s" (include "kds.configDir" .root) .name -}}
{{- end -}}

{{/* The tenants: mapping of the config file, as YAML ("" without tenants). */}}
{{- define "kds.tenantsConfig" -}}
{{- $root := . -}}
{{- $out := dict -}}
{{- range $name, $t := .Values.tenants -}}
{{- $doc := dict "ingress-topic" $t.ingressTopic -}}
{{- range $key, $opt := dict "dlqTopic" "dlq-topic" "targetAllowlist" "target-allowlist" "maxDelay" "max-delay" "changelogTopic" "changelog-topic" -}}
{{- if hasKey $t $key -}}
{{- $_ := set $doc $opt (get $t $key) -}}
{{- end -}}
{{- end -}}
{{- with $t.credentials -}}
{{- $dir := include "kds.tenantDir" (dict "root" $root "name" $name) -}}
{{- $_ := set $doc "kafka" (dict "sasl.username" (dict "file" (printf "%s/username" $dir)) "sasl.password" (dict "file" (printf "%s/password" $dir))) -}}
{{- end -}}
{{- $_ := set $out $name $doc -}}
{{- end -}}
{{- if $out -}}
{{- toYaml $out -}}
{{- end -}}
{{- end -}}

{{/* Refuse what the sidecar would refuse at start, naming the value to change. */}}
{{- define "kds.validateTenants" -}}
{{- if .Values.tenants -}}
{{- if .Values.config.changelogTopic -}}
{{- fail "config.changelogTopic is set and tenants are given: with tenants each one names its own (tenants.<name>.changelogTopic; default <ingressTopic>.changelog)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The projected sources of the tenants' credential Secrets (none without credentials). */}}
{{- define "kds.tenantSecretSources" -}}
{{- range $name, $t := .Values.tenants -}}
{{- with $t.credentials }}
- secret:
    name: {{ .existingSecret }}
    items:
      # group-readable only: fsGroup makes the sidecar's group own the files
      - key: {{ .usernameKey | default "username" }}
        path: tenants/{{ $name }}/username
        mode: 0440
      - key: {{ .passwordKey | default "password" }}
        path: tenants/{{ $name }}/password
        mode: 0440
{{- end -}}
{{- end -}}
{{- end -}}
