{{/* Chart name, bounded to 63 characters (label values, DNS names). */}}
{{- define "kbb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kbb.fullname" -}}
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

{{/* Name of the headless Service of the ring peers. */}}
{{- define "kbb.peersName" -}}
{{- printf "%s-peers" (include "kbb.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "kbb.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kbb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kbb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kbb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kbb.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kbb.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the OIDC client secret, cookie keys and peer key. */}}
{{- define "kbb.secretName" -}}
{{- default (include "kbb.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "kbb.tlsSecretName" -}}
{{- if .Values.tls.existingSecret }}
{{- .Values.tls.existingSecret }}
{{- else }}
{{- printf "%s-tls" (include "kbb.fullname" .) }}
{{- end }}
{{- end }}

{{- define "kbb.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* memory for a single replica, ring for several, unless set
(hashring: the deprecated name of ring). */}}
{{- define "kbb.sessionStore" -}}
{{- if eq .Values.session.store "hashring" }}
{{- "ring" }}
{{- else if .Values.session.store }}
{{- .Values.session.store }}
{{- else if gt (int .Values.replicaCount) 1 }}
{{- "ring" }}
{{- else }}
{{- "memory" }}
{{- end }}
{{- end }}

{{/* Host (without port) of externalURL. */}}
{{- define "kbb.externalHost" -}}
{{- (urlParse .Values.externalURL).hostname }}
{{- end }}

{{/* Path of externalURL, "/" when empty. */}}
{{- define "kbb.externalPath" -}}
{{- default "/" (urlParse .Values.externalURL).path }}
{{- end }}

{{/*
Checks across values that the schema cannot express, with messages that say
what to set. Included by the Deployment so every render runs them.
*/}}
{{- define "kbb.validate" -}}
{{- $v := .Values }}
{{- if not $v.externalURL }}
{{- fail "\n\nexternalURL is required: the public URL of the backend, e.g. --set externalURL=https://bind.example.com" }}
{{- end }}
{{- if not $v.oidc.issuerURL }}
{{- fail "\n\noidc.issuerURL is required: the URL of your OpenID Connect issuer, e.g. --set oidc.issuerURL=https://login.example.com" }}
{{- end }}
{{- if not $v.oidc.clientID }}
{{- fail "\n\noidc.clientID is required: the OAuth2 client ID registered at the issuer" }}
{{- end }}
{{- if and (not $v.secrets.existingSecret) (not $v.oidc.clientSecret) }}
{{- fail "\n\nthe OIDC client secret is missing: set oidc.clientSecret, or secrets.existingSecret to a Secret holding it" }}
{{- end }}
{{- if and (eq (include "kbb.sessionStore" .) "memory") (gt (int $v.replicaCount) 1) }}
{{- fail (printf "\n\nsession.store=memory with replicaCount=%d: each replica would know only its own sessions; use session.store=ring (or leave it empty) or replicaCount=1" (int $v.replicaCount)) }}
{{- end }}
{{- if and $v.tls.enabled $v.tls.certManager.enabled $v.tls.existingSecret }}
{{- fail "\n\ntls.existingSecret and tls.certManager.enabled exclude each other: serve your own Secret or let cert-manager make one" }}
{{- end }}
{{- if and $v.tls.enabled (not $v.tls.certManager.enabled) (not $v.tls.existingSecret) }}
{{- fail "\n\ntls.enabled needs a certificate: set tls.existingSecret to a kubernetes.io/tls Secret, or tls.certManager.enabled=true with tls.certManager.issuerRef.name" }}
{{- end }}
{{- if and $v.tls.certManager.enabled (not $v.tls.enabled) }}
{{- fail "\n\ntls.certManager.enabled needs tls.enabled=true" }}
{{- end }}
{{- if and $v.tls.certManager.enabled (not $v.tls.certManager.issuerRef.name) }}
{{- fail "\n\ntls.certManager.issuerRef.name is required: the cert-manager Issuer or ClusterIssuer that signs the serving certificate" }}
{{- end }}
{{- if and (not $v.callbackFlow) $v.callbackAllowedURLs }}
{{- fail "\n\ncallbackAllowedURLs with callbackFlow=false: the allow-list is for the callback flow; empty it or turn the callback flow on" }}
{{- end }}
{{- if eq (int $v.diagnostics.port) (int $v.containerPort) }}
{{- fail (printf "\n\ndiagnostics.port=%d is containerPort: the diagnostics need a port of their own, which the Service does not expose" (int $v.diagnostics.port)) }}
{{- end }}
{{- if and (eq (include "kbb.sessionStore" .) "ring") (eq (int $v.diagnostics.port) (int (include "kbb.ringPort" .))) }}
{{- fail (printf "\n\ndiagnostics.port=%d is ring.port: give each its own port" (int $v.diagnostics.port)) }}
{{- end }}
{{- if and $v.httpRoute.enabled (not $v.httpRoute.parentRefs) }}
{{- fail "\n\nhttpRoute.enabled needs httpRoute.parentRefs: the Gateway(s) to attach to, e.g. [{name: public, namespace: gateways}]" }}
{{- end }}
{{- $stop := addf (float64 $v.preStopSleepSeconds) (include "kbb.durationSeconds" $v.shutdownTimeout | float64) }}
{{- if le (float64 $v.terminationGracePeriodSeconds) $stop }}
{{- fail (printf "\n\nterminationGracePeriodSeconds=%d is too short: the pod would be killed before its in-flight requests finish; it must exceed preStopSleepSeconds=%d plus shutdownTimeout=%s (%gs in all), which bounds the drain; raise terminationGracePeriodSeconds (default 60) or lower the others" (int $v.terminationGracePeriodSeconds) (int $v.preStopSleepSeconds) $v.shutdownTimeout $stop) }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (eq (int $v.replicaCount) 1) (hasKey $v.podDisruptionBudget "minAvailable") }}
{{- if ge (int $v.podDisruptionBudget.minAvailable) 1 }}
{{- fail "\n\npodDisruptionBudget.minAvailable>=1 with replicaCount=1 blocks every node drain; use maxUnavailable or more replicas" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Seconds of a Go duration (the schema has checked its form), e.g. "1m30s" ->
90, for the checks above.
*/}}
{{- define "kbb.durationSeconds" -}}
{{- $perUnit := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $sum := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" . -1 }}
{{- $unit := regexFind "(ns|us|µs|ms|s|m|h)$" . }}
{{- $sum = addf $sum (mulf (trimSuffix $unit . | float64) (get $perUnit $unit)) }}
{{- end }}
{{- $sum }}
{{- end }}

{{/*
The backend's flags, as a YAML list (toYaml quotes what needs quoting).
Secrets are passed as files, never as flag values.
*/}}
{{- define "kbb.args" -}}
{{- $v := .Values }}
{{- $store := include "kbb.sessionStore" . }}
{{- $secretDir := "/etc/kube-bind-backend/secrets" }}
{{- $keys := $v.secrets.keys }}
{{- $args := list
  (printf "--listen-address=:%d" (int $v.containerPort))
  (printf "--diagnostics-address=:%d" (int $v.diagnostics.port))
  (printf "--external-url=%s" $v.externalURL)
  (printf "--pretty-name=%s" $v.prettyName)
  (printf "--namespace-prefix=%s" $v.namespacePrefix)
  (printf "--consumer-scope=%s" $v.consumerScope)
  (printf "--oidc-issuer-url=%s" $v.oidc.issuerURL)
  (printf "--oidc-issuer-client-id=%s" $v.oidc.clientID)
  (printf "--oidc-issuer-client-secret-file=%s/%s" $secretDir $keys.oidcClientSecret)
  (printf "--cookie-signing-key-file=%s/%s" $secretDir $keys.cookieSigningKey)
  (printf "--cookie-encryption-key-file=%s/%s" $secretDir $keys.cookieEncryptionKey)
  (printf "--cluster-secret-key-file=%s/%s" $secretDir $keys.clusterSecretKey)
  (printf "--credential-lifetime=%s" $v.credentials.lifetime)
  (printf "--credential-rotation-point=%s" (toString $v.credentials.rotationPoint))
  (printf "--credential-overlap=%s" $v.credentials.overlap)
  (printf "--binding-lifetime=%s" $v.credentials.bindingLifetime)
  (printf "--consumer-max-export-requests=%d" (int $v.consumer.maxExportRequests))
  (printf "--consumer-max-namespaces=%d" (int $v.consumer.maxNamespaces))
  (printf "--max-clusters-per-user=%d" (int $v.consumer.maxClustersPerUser))
  (printf "--cli-token-request-rate=%v" $v.cliTokens.requestRate)
  (printf "--cli-token-bind-rate=%v" $v.cliTokens.bindRate)
  (printf "--cli-token-revocations=%s" (ternary (printf "%s/%s-cli-token-revocations" .Release.Namespace (include "kbb.fullname" .)) "" $v.cliTokens.revocations))
  (printf "--session-ttl=%s" $v.session.ttl)
  (printf "--poll-interval=%s" $v.session.pollInterval)
  (printf "--max-polled-sessions=%d" (int $v.session.maxPolled))
  (printf "--session-write-rate=%v" $v.session.writeRate)
  (printf "--max-connections=%d" (int $v.connections.max))
  (printf "--max-connections-per-client=%d" (int $v.connections.maxPerClient))
  (printf "--session-create-rate=%v" $v.connections.sessionCreateRate)
  (printf "--grace-period=%s" $v.session.gracePeriod)
  (printf "--long-poll-max-wait=%s" $v.session.longPollMaxWait)
  (printf "--max-long-polls=%d" (int $v.session.maxLongPolls))
  (printf "--log-level=%s" $v.log.level)
  (printf "--log-format=%s" $v.log.format)
  (printf "--shutdown-timeout=%s" $v.shutdownTimeout)
  (printf "--session-store=%s" $store)
  (printf "--leader-election-lease-name=%s" (include "kbb.fullname" .))
  (printf "--gc-unused-binding-after=%s" $v.gc.unusedBindingAfter)
  (printf "--gc-dry-run=%t" $v.gc.dryRun)
  (printf "--heartbeat-leases=%t" (and $v.rbac.create $v.kbindV2.leases))
}}
{{- /* The backend refuses to start unless its admission policy is in force;
turning the policy off is turning that check off, knowingly. */}}
{{- if and $v.rbac.create $v.admissionPolicy.enabled }}
{{- $args = append $args (printf "--admission-policy=%s-scope" (include "kbb.fullname" .)) }}
{{- else }}
{{- $args = append $args "--unsafe-skip-admission-policy-check=true" }}
{{- end }}
{{- with $v.oidc.callbackURL }}
{{- $args = append $args (printf "--oidc-callback-url=%s" .) }}
{{- end }}
{{- with $v.oidc.allowedUsers }}
{{- $args = append $args (printf "--oidc-allowed-users=%s" (join "," .)) }}
{{- end }}
{{- with $v.oidc.allowedGroups }}
{{- $args = append $args (printf "--oidc-allowed-groups=%s" (join "," .)) }}
{{- end }}
{{- if not $v.callbackFlow }}
{{- $args = append $args "--callback-flow=false" }}
{{- end }}
{{- with $v.callbackAllowedURLs }}
{{- $args = append $args (printf "--callback-allowed-urls=%s" (join "," .)) }}
{{- end }}
{{- with $v.providerCluster.externalAddress }}
{{- $args = append $args (printf "--external-address=%s" .) }}
{{- end }}
{{- if $v.providerCluster.externalCA }}
{{- $args = append $args "--external-ca-file=/etc/kube-bind-backend/external-ca/ca.crt" }}
{{- end }}
{{- with $v.providerCluster.externalServerName }}
{{- $args = append $args (printf "--external-server-name=%s" .) }}
{{- end }}
{{- if eq $store "ring" }}
{{- $args = append $args (printf "--peer-listen-address=:%d" (int (include "kbb.ringPort" .))) }}
{{- $args = append $args (printf "--peer-service=%s/%s" .Release.Namespace (include "kbb.peersName" .)) }}
{{- $args = append $args "--peer-port-name=peer" }}
{{- $args = append $args (printf "--peer-key-file=%s/%s" $secretDir $keys.peerKey) }}
{{- end }}
{{- if $v.tls.enabled }}
{{- $args = append $args "--tls-cert-file=/etc/kube-bind-backend/tls/tls.crt" }}
{{- $args = append $args "--tls-key-file=/etc/kube-bind-backend/tls/tls.key" }}
{{- end }}
{{- range $v.extraArgs }}
{{- $args = append $args . }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
The data of the Secret the chart makes, rendered once per release render
(memoized in .Values, so the Deployment's checksum hashes the same random
keys the Secret holds). Generated keys are made once: on upgrade, lookup
finds the Secret of the previous release and its keys are kept, so cookies,
peer traffic and issued cluster secrets survive an upgrade (the cluster
secret key must never change: clients would lose their provider namespace
on the next bind). (helm template and --dry-run cannot
look up; they show fresh keys.) Each key file holds base64 text of random
bytes, as the backend's --cookie-*-key-file and --peer-key-file read them.
*/}}
{{- define "kbb.secretData" -}}
{{- if not (hasKey .Values "__kbbSecretData") }}
{{- $keys := .Values.secrets.keys }}
{{- $previous := dict }}
{{- with lookup "v1" "Secret" .Release.Namespace (include "kbb.fullname" .) }}
{{- $previous = default dict .data }}
{{- end }}
{{- $data := dict $keys.oidcClientSecret (.Values.oidc.clientSecret | b64enc) }}
{{- range $key, $size := dict $keys.cookieSigningKey 64 $keys.cookieEncryptionKey 32 $keys.peerKey 32 $keys.clusterSecretKey 32 }}
{{- $_ := set $data $key ((index $previous $key) | default (randBytes $size | b64enc)) }}
{{- end }}
{{- $_ := set .Values "__kbbSecretData" $data }}
{{- end }}
{{- toYaml (get .Values "__kbbSecretData") }}
{{- end }}

{{/* The ring's values; those set under their deprecated name hashring
(values of an older release, kept by an upgrade) take precedence. */}}
{{- define "kbb.ringPort" -}}
{{- $old := .Values.hashring | default dict }}
{{- $old.port | default .Values.ring.port }}
{{- end }}

{{- define "kbb.ringPublishNotReady" -}}
{{- $old := .Values.hashring | default dict }}
{{- if hasKey $old "publishNotReadyAddresses" }}
{{- $old.publishNotReadyAddresses }}
{{- else }}
{{- .Values.ring.publishNotReadyAddresses }}
{{- end }}
{{- end }}
