{{/* Names, labels, and the two things computed from values: the vLLM launch and the policy. */}}

{{- define "llm-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name; 40 characters leave room for "-vllm-<pool>-<ordinal>". */}}
{{- define "llm-gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llm-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llm-gateway.labels" -}}
helm.sh/chart: {{ include "llm-gateway.chart" . }}
{{ include "llm-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "llm-gateway.gatewaySelectorLabels" -}}
{{ include "llm-gateway.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/* Selector labels of one pool's vLLM pods; argument: (list $ $poolName). */}}
{{- define "llm-gateway.vllmSelectorLabels" -}}
{{- $root := index . 0 -}}
{{ include "llm-gateway.selectorLabels" $root }}
app.kubernetes.io/component: vllm
llm-gateway/pool: {{ index . 1 }}
{{- end -}}

{{/* Name of one pool's StatefulSet, headless Service, PDB and autoscaler: (list $ $poolName). */}}
{{- define "llm-gateway.vllmName" -}}
{{- printf "%s-vllm-%s" (include "llm-gateway.fullname" (index . 0)) (index . 1) | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "llm-gateway.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "llm-gateway.adminTokenSecret" -}}
{{- .Values.gateway.existingAdminTokenSecret | default (printf "%s-admin" (include "llm-gateway.fullname" .)) -}}
{{- end -}}

{{/* Pools that are enabled, checked; as YAML {name: pool values}. */}}
{{- define "llm-gateway.enabledPools" -}}
{{- $pools := dict -}}
{{- range $name, $pool := .Values.pools -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "pools.%s: a pool name must be lowercase letters, digits and '-'" $name) -}}
{{- end -}}
{{- if $pool.enabled -}}
{{- $_ := set $pools $name $pool -}}
{{- end -}}
{{- end -}}
{{- if not $pools -}}
{{- fail "pools: enable at least one pool" -}}
{{- end -}}
{{- toYaml $pools -}}
{{- end -}}

{{/*
One pool's vLLM launch, from the recipe's profile (files/vllm-args.yaml) and the pool's values;
argument: (list $ $poolName $pool). As YAML: command, args, env, port, tensorParallelSize,
servedModelName, managed (whether the chart runs the replicas), replicaCount (listed URLs), urls.
*/}}
{{- define "llm-gateway.launch" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $pool := index . 2 -}}
{{- $profiles := $root.Files.Get "files/vllm-args.yaml" | fromYaml -}}
{{- if not (hasKey $profiles $pool.profile) -}}
{{- fail (printf "pools.%s.profile: %q is not a profile of files/vllm-args.yaml (%s)" $name $pool.profile (keys $profiles | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $p := index $profiles $pool.profile -}}
{{- $model := $pool.model | default $p.model -}}
{{- $served := $pool.servedModelName | default $p.servedModelName -}}
{{- $args := list $model "--served-model-name" $served "--host" $p.host "--port" (toString $p.port) -}}
{{- $args = concat $args $p.flags -}}
{{- range $extra := ($pool.extraArgs | default list) -}}
{{- /* --set turns 8192 into a number; a container's args are strings. */ -}}
{{- $args = append $args (toString $extra) -}}
{{- end -}}
{{- $managed := not $pool.replicaUrls -}}
{{- $count := int $pool.replicas -}}
{{- if ne $root.Values.autoscaling.mode "none" -}}
{{- $count = int $pool.autoscaling.maxReplicas -}}
{{- if gt (int $pool.autoscaling.minReplicas) $count -}}
{{- fail (printf "pools.%s.autoscaling: minReplicas is above maxReplicas" $name) -}}
{{- end -}}
{{- end -}}
{{- if and $managed (lt $count 1) -}}
{{- fail (printf "pools.%s.replicas: at least 1 (a pool with no replica is refused by the gateway; to stop a pool's GPUs, set pools.%s.enabled: false)" $name $name) -}}
{{- end -}}
{{- $urls := list -}}
{{- if $managed -}}
{{- $sts := include "llm-gateway.vllmName" (list $root $name) -}}
{{- range $i := until $count -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc.%s:%d" $sts $i $sts $root.Release.Namespace $root.Values.clusterDomain (int $p.port)) -}}
{{- end -}}
{{- else -}}
{{- $urls = $pool.replicaUrls -}}
{{- end -}}
command: {{ toYaml $p.command | nindent 2 }}
args: {{ toYaml $args | nindent 2 }}
env: {{ toYaml ($p.env | default dict) | nindent 2 }}
port: {{ int $p.port }}
tensorParallelSize: {{ int $p.tensorParallelSize }}
kvEventsPort: {{ $p.kvEventsPort | default 0 | int }}
servedModelName: {{ $served | quote }}
managed: {{ $managed }}
urls: {{ toYaml $urls | nindent 2 }}
{{- end -}}

{{/* The routing policy file (router_policies/schema.py), as YAML. */}}
{{- define "llm-gateway.policy" -}}
{{- $root := . -}}
{{- $enabled := include "llm-gateway.enabledPools" . | fromYaml -}}
{{- $pools := dict -}}
{{- range $name, $pool := $enabled -}}
{{- $launch := include "llm-gateway.launch" (list $root $name $pool) | fromYaml -}}
{{- $autoscale := dict "min_replicas" (int $pool.autoscaling.minReplicas) "max_replicas" (int $pool.autoscaling.maxReplicas) -}}
{{- $entry := dict "model" $launch.servedModelName "replicas" $launch.urls "tensor_parallel_size" $launch.tensorParallelSize "autoscale" $autoscale -}}
{{- if and $launch.managed $launch.kvEventsPort -}}
{{- $_ := set $entry "prefix" (dict "events" (dict "port" (int $launch.kvEventsPort))) -}}
{{- end -}}
{{- $overrides := $pool.policy | default dict -}}
{{- range $key, $value := dict "min_replicas" "minReplicas" "max_replicas" "maxReplicas" -}}
{{- if hasKey ($overrides.autoscale | default dict) $key -}}
{{- fail (printf "pools.%s.policy.autoscale.%s: the chart sets it from pools.%s.autoscaling.%s, the autoscaler's own bound, so that the signal stays within it; set that instead" $name $key $name $value) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $pools $name (mergeOverwrite $entry (deepCopy $overrides)) -}}
{{- end -}}
{{- $policy := dict "pools" $pools -}}
{{- $tiers := dict -}}
{{- range $virtual, $tier := ($root.Values.policy.tiers | default dict) -}}
{{- range $role := list "small" "large" -}}
{{- if not (hasKey $root.Values.pools (index $tier $role)) -}}
{{- fail (printf "policy.tiers.%s.%s: %v is not a pool of pools (%s)" $virtual $role (index $tier $role) (keys $root.Values.pools | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- /* A tier over a disabled pool is left out, as the pool is. */ -}}
{{- if and (hasKey $pools $tier.small) (hasKey $pools $tier.large) -}}
{{- $_ := set $tiers $virtual $tier -}}
{{- end -}}
{{- end -}}
{{- if hasKey $root.Values.policy "pools" -}}
{{- fail "policy.pools: pools are the chart's `pools:` value (each pool's routing settings under pools.<name>.policy), not policy.pools" -}}
{{- end -}}
{{- if $tiers -}}
{{- $_ := set $policy "tiers" $tiers -}}
{{- end -}}
{{- range $key, $value := $root.Values.policy -}}
{{- if not (has $key (list "pools" "tiers")) -}}
{{- $_ := set $policy $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $policy -}}
{{- end -}}

{{/* "true" when an external Redis is configured: redis.url, or redis.existingUrlSecret. */}}
{{- define "llm-gateway.redisExternal" -}}
{{- if or .Values.redis.url .Values.redis.existingUrlSecret -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the chart runs its own Redis: redis.enabled true, or auto with several
processes routing (gateway pods plus pickers); never when an external one is configured. */}}
{{- define "llm-gateway.redisEnabled" -}}
{{- $enabled := toString .Values.redis.enabled -}}
{{- /* Every process that routes to the replicas: the gateway pods and the pickers. */ -}}
{{- $routers := int .Values.gateway.replicas -}}
{{- if .Values.picker.enabled -}}
{{- $routers = add $routers (int .Values.picker.replicas) -}}
{{- end -}}
{{- if and (not (include "llm-gateway.redisExternal" .)) (or (eq $enabled "true") (and (eq $enabled "auto") (gt (int $routers) 1))) -}}
true
{{- end -}}
{{- end -}}

{{/* The Secret that holds an external Redis URL: redis.existingUrlSecret, else the chart's. */}}
{{- define "llm-gateway.redisUrlSecret" -}}
{{- .Values.redis.existingUrlSecret | default (printf "%s-redis-url" (include "llm-gateway.fullname" .)) -}}
{{- end -}}

{{- define "llm-gateway.redisUrlSecretKey" -}}
{{- .Values.redis.existingUrlSecretKey | default "redis-url" -}}
{{- end -}}

{{/* "true" when the pods get GATEWAY_REDIS_URL (an external Redis or the chart's own). */}}
{{- define "llm-gateway.redisConfigured" -}}
{{- if or (include "llm-gateway.redisExternal" .) (include "llm-gateway.redisEnabled" .) -}}
true
{{- end -}}
{{- end -}}

{{/* The Secret holding the chart's own Redis's password: redis.auth.existingSecret, else
the chart's (templates/redis.yaml). */}}
{{- define "llm-gateway.redisAuthSecret" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis-auth" (include "llm-gateway.fullname" .)) -}}
{{- end -}}

{{- define "llm-gateway.redisAuthSecretKey" -}}
{{- .Values.redis.auth.existingSecretKey | default "redis-password" -}}
{{- end -}}

{{/* The REDIS_PASSWORD entry of a container's env (a list item), from its Secret. */}}
{{- define "llm-gateway.redisPasswordEnv" -}}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "llm-gateway.redisAuthSecret" . }}
      key: {{ include "llm-gateway.redisAuthSecretKey" . }}
{{- end -}}

{{/* The GATEWAY_REDIS_URL entry of a container's env (a list item), or nothing: an external
Redis's URL (it may hold a password) from its Secret; for the chart's own Redis, its password
from its Secret and the URL built on it (Kubernetes expands $(REDIS_PASSWORD) in the pod). */}}
{{- define "llm-gateway.redisUrlEnv" -}}
{{- if include "llm-gateway.redisExternal" . -}}
- name: GATEWAY_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "llm-gateway.redisUrlSecret" . }}
      key: {{ include "llm-gateway.redisUrlSecretKey" . }}
{{- /* An external Redis may serve other releases (staging beside production): their keys,
pools named alike, are kept apart unless a prefix was chosen (gateway.env, policy.state). */}}
{{- if not (or (hasKey (.Values.gateway.env | default dict) "GATEWAY_STATE_KEY_PREFIX") (.Values.policy.state | default dict).key_prefix) }}
- name: GATEWAY_STATE_KEY_PREFIX
  value: {{ printf "llm-gateway:%s:%s" .Release.Namespace .Release.Name | quote }}
{{- end }}
{{- else if include "llm-gateway.redisEnabled" . -}}
{{ include "llm-gateway.redisPasswordEnv" . }}
- name: GATEWAY_REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s-redis:6379/0" (include "llm-gateway.fullname" .) | quote }}
{{- end -}}
{{- end -}}

{{/* Refuses a gateway.env key the chart sets itself (a Deployment with the name twice: which
one a pod gets is not what either value says), naming the value that sets it. The admin token
and the Redis URL are the chart's only when it sets them (gateway.adminToken, redis.*): without,
gateway.env may carry them. */}}
{{- define "llm-gateway.checkEnv" -}}
{{- $g := .Values.gateway }}
{{- $managed := dict
  "GATEWAY_HOST" "nothing: the pods listen on 0.0.0.0, which their probes and Service need"
  "GATEWAY_PORT" "gateway.port (the picker's: picker.httpPort)"
  "GATEWAY_POLICY" "policy (the chart's ConfigMap)"
  "GATEWAY_LOG_LEVEL" "gateway.logLevel"
  "GATEWAY_WORKERS" "gateway.workers"
  "GATEWAY_SHUTDOWN_DELAY_S" "gateway.shutdownDelaySeconds"
  "GATEWAY_DRAIN_TIMEOUT_S" "gateway.drainTimeoutSeconds" }}
{{- if or $g.adminToken $g.existingAdminTokenSecret }}
{{- $_ := set $managed "GATEWAY_ADMIN_TOKEN" "gateway.adminToken or gateway.existingAdminTokenSecret alone" }}
{{- end }}
{{- if include "llm-gateway.redisConfigured" . }}
{{- $_ := set $managed "GATEWAY_REDIS_URL" "redis.url, redis.existingUrlSecret or redis.enabled alone" }}
{{- end }}
{{- if include "llm-gateway.redisEnabled" . }}
{{- $_ := set $managed "REDIS_PASSWORD" "redis.auth.existingSecret (the chart's own Redis's password)" }}
{{- end }}
{{- range $name := keys ($g.env | default dict) | sortAlpha }}
{{- if hasKey $managed $name }}
{{- fail (printf "gateway.env.%s: the chart sets %s itself; use %s" $name $name (get $managed $name)) }}
{{- end }}
{{- end }}
{{- end -}}
