{{/* The chart's name, or nameOverride. */}}
{{- define "mm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the chart's objects: fullnameOverride, else the release name, or release-name when
they differ. */}}
{{- define "mm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "mm.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mm.labels" -}}
{{ include "mm.selectorLabels" . }}
app.kubernetes.io/component: materializer
{{ include "mm.versionLabels" . }}
{{- end -}}

{{- define "mm.versionLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The daemon's pods: the Deployment's selector (name, instance; immutable, so it stays as it was)
plus the component, which the Service, the PodDisruptionBudget, the PodMonitor and the spread
constraint select on, so that the pods of the Jobs (patrol, replay, re-drive, schema) never count
as replicas.
*/}}
{{- define "mm.daemonSelectorLabels" -}}
{{ include "mm.selectorLabels" . }}
app.kubernetes.io/component: materializer
{{- end -}}

{{/*
Labels of a Job and its pods, with (dict "root" $ "component" "patrol"). A bare Pod (the helm test
hook) must not carry the Deployment's selector, or its ReplicaSet would adopt it: `bare` leaves
app.kubernetes.io/name out. `versioned` adds the chart's version labels: not on a Job's pod
template, which cannot change once the Job exists (an upgrade of the chart would fail on it).
*/}}
{{- define "mm.componentLabels" -}}
{{- if not .bare -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
{{ end -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/part-of: {{ .root.Chart.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .versioned }}
{{ include "mm.versionLabels" .root }}
{{- else }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}
{{- end -}}

{{/* [registry/]repository@digest when a digest is given, [registry/]repository:tag otherwise;
the registry is image.registry, else global.imageRegistry. */}}
{{- define "mm.image" -}}
{{- $registry := default (.Values.global).imageRegistry .Values.image.registry -}}
{{- $repository := required "image.repository is required: the image you built (docker build . or scripts/build-image) and pushed to your registry, e.g. --set image.repository=registry.example/mailbox-materializer (no image of this product is published)" .Values.image.repository -}}
{{- if $registry -}}{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
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


{{/* The service account of every pod: serviceAccount.name, the release's name when the chart
creates it, the namespace's default otherwise. The old top-level serviceAccountName (an existing
account) still wins, and then none is created. */}}
{{- define "mm.serviceAccountName" -}}
{{- if .Values.serviceAccountName -}}
{{- .Values.serviceAccountName -}}
{{- else if .Values.serviceAccount.create -}}
{{- default (include "mm.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "mm.createServiceAccount" -}}
{{- if and .Values.serviceAccount.create (not .Values.serviceAccountName) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the security contexts are adapted to OpenShift's restricted SCCs (which assign
a UID and GID from the namespace's range): forced, or `auto` on a cluster serving the
security.openshift.io API. */}}
{{- define "mm.openshift" -}}
{{- $adapt := dig "compatibility" "openshift" "adaptSecurityContext" "auto" (default dict .Values.global) -}}
{{- if or (eq $adapt "force") (and (eq $adapt "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}true{{- end -}}
{{- end -}}

{{/* A security context from values, without the fixed IDs on OpenShift. */}}
{{- define "mm.securityContext" -}}
{{- $context := deepCopy (default dict .context) -}}
{{- if include "mm.openshift" .root -}}
{{- range $key := list "runAsUser" "runAsGroup" "fsGroup" "seLinuxOptions" -}}
{{- $_ := unset $context $key -}}
{{- end -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}

{{/*
The pieces every pod of the chart shares (the daemon, the patrol CronJob, the replay and re-drive
Jobs, the helm test Pod, the schema hook), written once.
*/}}

{{/* Pod-level settings: account, priority, registry secrets, security context, placement
(affinity is the caller's: the Deployment spreads its pods by default). */}}
{{- define "mm.podSettings" -}}
{{- include "mm.podAccount" (dict "root" . "serviceAccountName" (include "mm.serviceAccountName" .)) }}
{{- include "mm.podPlacement" . }}
{{- end -}}

{{- define "mm.podAccount" -}}
serviceAccountName: {{ .serviceAccountName }}
automountServiceAccountToken: {{ .root.Values.serviceAccount.automountServiceAccountToken }}
{{- end -}}

{{- define "mm.podPlacement" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "mm.securityContext" (dict "root" . "context" .Values.podSecurityContext) | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The environment from the Secret (secret.*), as a list (possibly empty). */}}
{{- define "mm.secretEnv" -}}
{{- $secret := .Values.secret.name }}
{{- $env := list }}
{{- if $secret }}
{{- if .Values.secret.redisUrlKey }}
{{- $env = append $env (dict "name" "MATERIALIZER_REDIS_URL" "key" .Values.secret.redisUrlKey) }}
{{- end }}
{{- if .Values.secret.scyllaUsernameKey }}
{{- $env = append $env (dict "name" "MATERIALIZER_SCYLLA_USERNAME" "key" .Values.secret.scyllaUsernameKey) }}
{{- end }}
{{- if .Values.secret.scyllaPasswordKey }}
{{- $env = append $env (dict "name" "MATERIALIZER_SCYLLA_PASSWORD" "key" .Values.secret.scyllaPasswordKey) }}
{{- end }}
{{- range $property := keys .Values.secret.kafkaProperties | sortAlpha }}
{{- $env = append $env (dict "name" (include "mm.kafkaPropertyEnv" $property) "key" (get $.Values.secret.kafkaProperties $property)) }}
{{- end }}
{{- end }}
{{- range $env }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .key }}
      optional: {{ $.Values.secret.optional | default false }}
{{- end }}
{{- end -}}

{{/* Container settings: security context, environment (`env`, a list of entries put first, then
the Secret's unless `noSecretEnv`, then extraEnv), envFrom, mounts. */}}
{{- define "mm.containerSettings" -}}
{{- $root := .root -}}
{{- $secretEnv := "" -}}
{{- if not .noSecretEnv }}{{ $secretEnv = trim (include "mm.secretEnv" $root) }}{{ end -}}
securityContext:
  {{- include "mm.securityContext" (dict "root" $root "context" $root.Values.containerSecurityContext) | nindent 2 }}
{{- if or .env $secretEnv $root.Values.extraEnv }}
env:
  {{- with .env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with $secretEnv }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- with $root.Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- with $root.Values.envFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: config
    mountPath: /etc/materializer
    readOnly: true
  - name: tmp
    mountPath: /tmp
  {{- with $root.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The volumes behind mm.containerSettings' mounts; (dict "root" $ "configMap" NAME). */}}
{{- define "mm.volumes" -}}
- name: config
  configMap:
    name: {{ .configMap }}
- name: tmp
  emptyDir:
    sizeLimit: 16Mi
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The configuration file's path inside every container. */}}
{{- define "mm.configPath" -}}/etc/materializer/materializer.toml{{- end -}}

{{/*
A one-shot pod running one materializer command with the release's image, configuration, Secret,
environment and volumes: (dict "root" $ "args" LIST "resources" MAP). The schema hook passes its
own "configMap", "serviceAccountName", "env" and "noSecretEnv".
*/}}
{{- define "mm.commandPodSpec" -}}
{{- $root := .root -}}
restartPolicy: Never
{{ include "mm.podAccount" (dict "root" $root "serviceAccountName" (default (include "mm.serviceAccountName" $root) .serviceAccountName)) }}
{{- include "mm.podPlacement" $root }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: materializer
    image: {{ include "mm.image" $root | quote }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args: {{ toJson .args }}
    {{- with .resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- include "mm.containerSettings" (dict "root" $root "env" .env "noSecretEnv" .noSecretEnv) | nindent 4 }}
volumes:
  {{- include "mm.volumes" (dict "root" $root "configMap" (default (include "mm.fullname" $root) .configMap)) | nindent 2 }}
{{- end -}}

{{/*
A Job's failure policy for the materializer's exit table (SPEC 8.2, the same for every command):
2 (unreachable or transient: "retry later") is retried up to backoffLimit; any other failure (1 a
finding or refusal, 3 a corrupt mailbox, 4 interrupted, 64 a usage error such as a typo in
jobs.*.args) fails the Job at once, since a retry would only repeat it. A pod evicted by a drain
does not count.
*/}}
{{- define "mm.podFailurePolicy" -}}
podFailurePolicy:
  rules:
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
          status: "True"
    - action: FailJob
      onExitCodes:
        containerName: materializer
        operator: NotIn
        values: [0, 2]
{{- end -}}

{{/*
The lag the autoscaler acts on, as a PromQL expression: the consumer lag of every partition, minus
the partitions holding a blocked mailbox. A blocked mailbox pins its partition's committed offset
(the records behind it are applied, but the offset waits for the repair), so that lag grows with
every record while no replica could reduce it: counted, it would scale the Deployment to its
maximum for nothing. `unless` matches on every label (the two gauges of one partition come from
the same scrape). The series are those of this release: autoscaling.lagSelector, or by default its
namespace and the job the chart's ServiceMonitor (the Service's name) or PodMonitor
(namespace/name) gives them.
*/}}
{{- define "mm.lagSelector" -}}
{{- $root := . -}}
{{- if .Values.autoscaling.lagSelector -}}
{{- .Values.autoscaling.lagSelector -}}
{{- else -}}
{{- $job := include "mm.fullname" $root -}}
{{- if and .Values.metrics.podMonitor.enabled (not .Values.metrics.serviceMonitor.enabled) -}}
{{- $job = printf "%s/%s" .Release.Namespace $job -}}
{{- end -}}
{{- printf "namespace=%q, job=%q" .Release.Namespace $job -}}
{{- end -}}
{{- end -}}

{{- define "mm.scalingLagQuery" -}}
{{- $selector := include "mm.lagSelector" . -}}
{{- printf "sum(materializer_consumer_lag{%s} unless (materializer_partition_blocked{%s} > 0)) or vector(0)" $selector $selector -}}
{{- end -}}

{{/* The name of a values-driven Job: (dict "root" $ "component" "replay" "name" "repair-u-17"). */}}
{{- define "mm.jobName" -}}
{{- printf "%s-%s-%s" (include "mm.fullname" .root | trunc 30 | trimSuffix "-") .component .name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The patrol CronJob's name (at most 52 characters: its Jobs add 11). */}}
{{- define "mm.verifyName" -}}
{{- printf "%s-verify" (include "mm.fullname" . | trunc 40 | trimSuffix "-") -}}
{{- end -}}

{{- define "mm.patrolName" -}}
{{- printf "%s-patrol" (include "mm.fullname" . | trunc 45 | trimSuffix "-") -}}
{{- end -}}
