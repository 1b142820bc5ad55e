{{/* Name of the chart's objects: the release name, or release-chart when they differ. */}}
{{- define "mm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mm.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mm.labels" -}}
{{ include "mm.selectorLabels" . }}
app.kubernetes.io/component: materializer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* repository@digest when a digest is given, repository:tag otherwise. */}}
{{- define "mm.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
One TOML value. Helm reads every YAML number as a float, so integral numbers are printed as
integers (the daemon's integer keys refuse 1000.0); strings and lists are JSON, which TOML reads
the same way.
*/}}
{{- define "mm.tomlValue" -}}
{{- if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if kindIs "int64" . -}}
{{ . }}
{{- else if kindIs "int" . -}}
{{ . }}
{{- else if kindIs "bool" . -}}
{{ . }}
{{- else if kindIs "slice" . -}}
[{{- range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "mm.tomlValue" $v }}{{- end -}}]
{{- else -}}
{{ toString . | toJson }}
{{- end -}}
{{- end -}}

{{/*
A TOML table: its plain keys first, then its sub-tables under [path.name] headers (TOML wants
a table's own keys before any sub-table). Called with (dict "path" "kafka" "table" $map).
*/}}
{{- define "mm.tomlTable" -}}
{{- $path := .path -}}
{{- $table := .table -}}
{{- range $key := keys $table | sortAlpha }}
{{- $value := get $table $key }}
{{- if not (kindIs "map" $value) }}
{{ toJson $key }} = {{ include "mm.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key := keys $table | sortAlpha }}
{{- $value := get $table $key }}
{{- if kindIs "map" $value }}
{{- $sub := ternary $key (printf "%s.%s" $path $key) (eq $path "") }}

[{{ $sub }}]
{{- include "mm.tomlTable" (dict "path" $sub "table" $value) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The environment variable of a librdkafka property: sasl.password -> ..._SASL_PASSWORD. */}}
{{- define "mm.kafkaPropertyEnv" -}}
{{- printf "MATERIALIZER_KAFKA_PROPERTY_%s" (. | replace "." "_" | replace "-" "_" | upper) -}}
{{- end -}}
