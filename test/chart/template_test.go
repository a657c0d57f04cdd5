package chart_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

const (
	fullname  = "kbb-kube-bind-backend"
	secretDir = "/etc/kube-bind-backend/secrets"
)

func TestLint(t *testing.T) {
	for name, sets := range map[string][]string{
		"required values only": nil,
		"everything on": {
			"tls.enabled=true", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=letsencrypt",
			"ingress.enabled=true", "ingress.className=nginx",
			"httpRoute.enabled=true", "httpRoute.parentRefs[0].name=public",
			"providerCluster.externalAddress=https://api.example.com:6443",
		},
		"one replica": {"replicaCount=1"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", chartDir(t)}, setArgs(append(requiredValues(), sets...))...)...)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Fatalf("unexpected lint output:\n%s", out)
			}
		})
	}
}

func TestDefaultsRenderAHardenedRingDeployment(t *testing.T) {
	objs := render(t)

	d := objs.get(t, "Deployment", fullname)
	if got := field(t, d, "spec", "replicas"); got != int64(2) {
		t.Errorf("replicas = %v, want 2", got)
	}
	podSpec := asMap(t, field(t, d, "spec", "template", "spec"))
	if podSpec["serviceAccountName"] != fullname {
		t.Errorf("serviceAccountName = %v", podSpec["serviceAccountName"])
	}
	psc := asMap(t, podSpec["securityContext"])
	if psc["runAsNonRoot"] != true || psc["runAsUser"] != int64(65532) {
		t.Errorf("pod securityContext %v: want runAsNonRoot and uid 65532", psc)
	}
	c := container(t, objs)
	sc := asMap(t, c["securityContext"])
	if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false || sc["runAsNonRoot"] != true {
		t.Errorf("container securityContext %v: want read-only root, no privilege escalation, non-root", sc)
	}
	if drop := asSlice(t, asMap(t, sc["capabilities"])["drop"]); !reflect.DeepEqual(drop, []any{"ALL"}) {
		t.Errorf("capabilities.drop = %v, want [ALL]", drop)
	}
	if seccomp := asMap(t, sc["seccompProfile"]); seccomp["type"] != "RuntimeDefault" {
		t.Errorf("seccompProfile = %v", seccomp)
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		get := asMap(t, asMap(t, c[probe])["httpGet"])
		if get["path"] != path || get["port"] != "diagnostics" || get["scheme"] != "HTTP" {
			t.Errorf("%s = %v, want HTTP GET %s on port diagnostics", probe, get, path)
		}
	}
	if res := asMap(t, c["resources"]); res["requests"] == nil || asMap(t, res["limits"])["memory"] == nil {
		t.Errorf("resources %v: want requests and a memory limit", res)
	}

	f := flags(t, objs)
	want := map[string]string{
		"--listen-address":                 ":8080",
		"--diagnostics-address":            ":9090",
		"--external-url":                   "https://bind.example.com",
		"--oidc-issuer-url":                "https://login.example.com",
		"--oidc-issuer-client-id":          "kube-bind",
		"--oidc-issuer-client-secret-file": secretDir + "/oidc-client-secret",
		"--cookie-signing-key-file":        secretDir + "/cookie-signing-key",
		"--cookie-encryption-key-file":     secretDir + "/cookie-encryption-key",
		"--consumer-scope":                 "Namespaced",
		"--session-store":                  "ring",
		"--peer-listen-address":            ":8081",
		"--peer-service":                   "bind-system/" + fullname + "-peers",
		"--peer-key-file":                  secretDir + "/peer-key",
		"--peer-port-name":                 "peer",
		"--session-ttl":                    "10m",
		"--poll-interval":                  "2s",
	}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("flag %s = %q, want %q", k, f[k], v)
		}
	}
	for _, absent := range []string{"--tls-cert-file", "--external-address", "--external-ca-file", "--oidc-issuer-client-secret", "--kubeconfig"} {
		if _, ok := f[absent]; ok {
			t.Errorf("flag %s set by default", absent)
		}
	}
	// No secret value appears in the Deployment.
	if b, _ := d.MarshalJSON(); bytes.Contains(b, []byte("s3cr3t")) {
		t.Error("the OIDC client secret appears in the Deployment")
	}

	// The generated Secret: the client secret as given, keys random and long.
	s := objs.get(t, "Secret", fullname)
	data := asMap(t, field(t, s, "data"))
	decoded := map[string]string{}
	for k, v := range data {
		b, err := base64.StdEncoding.DecodeString(v.(string))
		if err != nil {
			t.Fatalf("Secret key %s: %v", k, err)
		}
		decoded[k] = string(b)
	}
	if decoded["oidc-client-secret"] != "s3cr3t" {
		t.Errorf("oidc-client-secret = %q", decoded["oidc-client-secret"])
	}
	// Each key file is base64 text of random bytes, as the backend reads it.
	for k, n := range map[string]int{"cookie-signing-key": 64, "cookie-encryption-key": 32, "peer-key": 32} {
		raw, err := base64.StdEncoding.DecodeString(decoded[k])
		if err != nil || len(raw) != n {
			t.Errorf("generated %s = %q: want base64 of %d bytes (%d bytes, %v)", k, decoded[k], n, len(raw), err)
		}
	}
	again := render(t)
	s2 := asMap(t, field(t, again.get(t, "Secret", fullname), "data"))
	if s2["cookie-signing-key"] == data["cookie-signing-key"] {
		t.Error("two renders without a previous release generated the same cookie key: not random")
	}

	// Peers: headless Service (a replica that is not ready leaves the
	// ring), EndpointSlice and session-record access in the namespace only.
	peers := objs.get(t, "Service", fullname+"-peers")
	if field(t, peers, "spec", "clusterIP") != "None" || field(t, peers, "spec", "publishNotReadyAddresses") != false {
		t.Errorf("peer Service spec %v: want headless, listing ready replicas only", field(t, peers, "spec"))
	}
	role := objs.get(t, "Role", fullname+"-peers")
	if role.GetNamespace() != "bind-system" {
		t.Errorf("peer Role in namespace %q", role.GetNamespace())
	}
	pdb := objs.get(t, "PodDisruptionBudget", fullname)
	if field(t, pdb, "spec", "maxUnavailable") != int64(1) {
		t.Errorf("PDB spec %v", field(t, pdb, "spec"))
	}
	if sel := asMap(t, field(t, pdb, "spec", "selector", "matchLabels")); !reflect.DeepEqual(sel, asMap(t, field(t, d, "spec", "selector", "matchLabels"))) {
		t.Errorf("PDB selects %v, not the Deployment's pods", sel)
	}
	assertSafeRollout(t, objs, 5, 60)
	svc := objs.get(t, "Service", fullname)
	port := asMap(t, asSlice(t, field(t, svc, "spec", "ports"))[0])
	if port["port"] != int64(80) || port["targetPort"] != "http" {
		t.Errorf("Service port %v", port)
	}
	for _, kind := range []string{"Ingress", "HTTPRoute", "Certificate", "ConfigMap"} {
		if n := len(objs.ofKind(kind)); n != 0 {
			t.Errorf("%d %s rendered by default", n, kind)
		}
	}
	if n := len(objs.ofKind("CustomResourceDefinition")); n != 7 {
		t.Errorf("%d CRDs rendered, want the 7 kube-bind.io CRDs", n)
	}
}

// assertSafeRollout checks what makes helm upgrade and node drains lose no
// session: a new pod is ready before an old one stops, a terminating pod
// sleeps preStop seconds before SIGTERM (0: no hook), and the grace period
// covers that sleep and the drain.
func assertSafeRollout(t *testing.T, objs objects, preStop, grace int64) {
	t.Helper()
	d := objs.get(t, "Deployment", fullname)
	strategy := asMap(t, field(t, d, "spec", "strategy"))
	if strategy["type"] != "RollingUpdate" {
		t.Errorf("strategy %v, want RollingUpdate", strategy)
	}
	if ru := asMap(t, strategy["rollingUpdate"]); ru["maxUnavailable"] != int64(0) || ru["maxSurge"] != int64(1) {
		t.Errorf("rollingUpdate %v, want maxUnavailable 0 and maxSurge 1", ru)
	}
	if got := field(t, d, "spec", "template", "spec", "terminationGracePeriodSeconds"); got != grace {
		t.Errorf("terminationGracePeriodSeconds = %v, want %d", got, grace)
	}
	c := container(t, objs)
	lifecycle, has := c["lifecycle"]
	if preStop == 0 {
		if has {
			t.Errorf("lifecycle %v with preStopSleepSeconds=0, want none", lifecycle)
		}
	} else {
		// The image has no shell: the kubelet's own sleep action, never exec.
		want := map[string]any{"preStop": map[string]any{"sleep": map[string]any{"seconds": preStop}}}
		if !has || !reflect.DeepEqual(lifecycle, want) {
			t.Errorf("lifecycle %v, want %v", lifecycle, want)
		}
	}
	f := flags(t, objs)
	shutdown, err := time.ParseDuration(f["--shutdown-timeout"])
	if err != nil {
		t.Fatalf("--shutdown-timeout %q: %v", f["--shutdown-timeout"], err)
	}
	if left := time.Duration(grace)*time.Second - time.Duration(preStop)*time.Second - shutdown; left <= 0 {
		t.Errorf("grace %ds, preStop %ds, shutdown timeout %s: no time left for the drain", grace, preStop, shutdown)
	}
	// Readiness gates the rollout: maxUnavailable 0 waits for the new pod's
	// /readyz, which the backend answers only once its session records are read.
	if get := asMap(t, asMap(t, c["readinessProbe"])["httpGet"]); get["path"] != "/readyz" {
		t.Errorf("readinessProbe %v, want /readyz", get)
	}
}

func TestRolloutTimingIsConfigurable(t *testing.T) {
	assertSafeRollout(t, render(t, "preStopSleepSeconds=0"), 0, 60)
	assertSafeRollout(t, render(t, "preStopSleepSeconds=10", "terminationGracePeriodSeconds=120", "shutdownTimeout=1m30s"), 10, 120)
}

// An upgrade keeps an older release's values, which name the ring by its
// former name: they render the ring, with their port.
func TestFormerRingValues(t *testing.T) {
	objs := render(t, "session.store=hashring", "hashring.port=9191", "hashring.publishNotReadyAddresses=true")
	f := flags(t, objs)
	if f["--session-store"] != "ring" || f["--peer-listen-address"] != ":9191" {
		t.Errorf("--session-store=%q --peer-listen-address=%q, want ring on :9191", f["--session-store"], f["--peer-listen-address"])
	}
	peers := objs.get(t, "Service", fullname+"-peers")
	if field(t, peers, "spec", "publishNotReadyAddresses") != true {
		t.Errorf("peer Service: publishNotReadyAddresses %v, want the former value's true", field(t, peers, "spec", "publishNotReadyAddresses"))
	}
}

func TestOneReplicaUsesTheMemoryStore(t *testing.T) {
	objs := render(t, "replicaCount=1")
	f := flags(t, objs)
	if f["--session-store"] != "memory" {
		t.Errorf("--session-store = %q, want memory", f["--session-store"])
	}
	for _, absent := range []string{"--peer-listen-address", "--peer-service", "--peer-key-file", "--peer-port-name"} {
		if _, ok := f[absent]; ok {
			t.Errorf("%s set for a single replica", absent)
		}
	}
	if objs.find("Service", fullname+"-peers") != nil || objs.find("Role", fullname+"-peers") != nil {
		t.Error("peer Service or Role rendered for a single replica")
	}
}

func TestIngressAndHTTPRoute(t *testing.T) {
	objs := render(t,
		"externalURL=https://bind.example.com:8443/kb",
		"ingress.enabled=true", "ingress.className=nginx", "ingress.tlsSecretName=bind-tls",
		"httpRoute.enabled=true", "httpRoute.parentRefs[0].name=public", "httpRoute.parentRefs[0].namespace=gateways")

	ing := objs.get(t, "Ingress", fullname)
	rule := asMap(t, asSlice(t, field(t, ing, "spec", "rules"))[0])
	if rule["host"] != "bind.example.com" {
		t.Errorf("Ingress host %v, want bind.example.com (no port)", rule["host"])
	}
	path := asMap(t, asSlice(t, asMap(t, rule["http"])["paths"])[0])
	if path["path"] != "/kb" {
		t.Errorf("Ingress path %v, want /kb", path["path"])
	}
	if field(t, ing, "spec", "ingressClassName") != "nginx" {
		t.Error("ingressClassName not set")
	}
	tls := asMap(t, asSlice(t, field(t, ing, "spec", "tls"))[0])
	if tls["secretName"] != "bind-tls" {
		t.Errorf("Ingress tls %v", tls)
	}

	route := objs.get(t, "HTTPRoute", fullname)
	if route.GetAPIVersion() != "gateway.networking.k8s.io/v1" {
		t.Errorf("HTTPRoute apiVersion %s", route.GetAPIVersion())
	}
	if h := asSlice(t, field(t, route, "spec", "hostnames")); !reflect.DeepEqual(h, []any{"bind.example.com"}) {
		t.Errorf("HTTPRoute hostnames %v", h)
	}
	parent := asMap(t, asSlice(t, field(t, route, "spec", "parentRefs"))[0])
	if parent["name"] != "public" || parent["namespace"] != "gateways" {
		t.Errorf("HTTPRoute parentRefs %v", parent)
	}
	backend := asMap(t, asSlice(t, asMap(t, asSlice(t, field(t, route, "spec", "rules"))[0])["backendRefs"])[0])
	if backend["name"] != fullname || backend["port"] != int64(80) {
		t.Errorf("HTTPRoute backendRef %v", backend)
	}
}

func TestTLSFromCertManager(t *testing.T) {
	objs := render(t, "tls.enabled=true", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=letsencrypt")
	cert := objs.get(t, "Certificate", fullname)
	if field(t, cert, "spec", "secretName") != fullname+"-tls" {
		t.Errorf("Certificate secretName %v", field(t, cert, "spec", "secretName"))
	}
	dns := asSlice(t, field(t, cert, "spec", "dnsNames"))
	if dns[0] != "bind.example.com" {
		t.Errorf("Certificate dnsNames %v: want the externalURL host first", dns)
	}
	if ref := asMap(t, field(t, cert, "spec", "issuerRef")); ref["name"] != "letsencrypt" || ref["kind"] != "ClusterIssuer" {
		t.Errorf("issuerRef %v", ref)
	}
	f := flags(t, objs)
	if f["--tls-cert-file"] != "/etc/kube-bind-backend/tls/tls.crt" || f["--tls-key-file"] != "/etc/kube-bind-backend/tls/tls.key" {
		t.Errorf("TLS flags %q %q", f["--tls-cert-file"], f["--tls-key-file"])
	}
	c := container(t, objs)
	// The probes' port stays plain HTTP: TLS is the public port's.
	if get := asMap(t, asMap(t, c["readinessProbe"])["httpGet"]); get["scheme"] != "HTTP" || get["port"] != "diagnostics" {
		t.Errorf("readiness probe %v with TLS on, want HTTP on port diagnostics", get)
	}
	mounted := false
	for _, m := range asSlice(t, c["volumeMounts"]) {
		if mm := asMap(t, m); mm["name"] == "tls" && mm["mountPath"] == "/etc/kube-bind-backend/tls" && mm["readOnly"] == true {
			mounted = true
		}
	}
	d := objs.get(t, "Deployment", fullname)
	for _, v := range asSlice(t, field(t, d, "spec", "template", "spec", "volumes")) {
		if vv := asMap(t, v); vv["name"] == "tls" && asMap(t, vv["secret"])["secretName"] != fullname+"-tls" {
			t.Errorf("tls volume %v does not mount the Certificate's Secret", vv)
		}
	}
	if !mounted {
		t.Error("the TLS Secret is not mounted read-only at /etc/kube-bind-backend/tls")
	}
	port := asMap(t, asSlice(t, field(t, objs.get(t, "Service", fullname), "spec", "ports"))[0])
	if port["name"] != "https" || port["appProtocol"] != "https" {
		t.Errorf("Service port with TLS: %v", port)
	}
}

func TestExistingSecretAndExternalCluster(t *testing.T) {
	ca := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
	objs := render(t,
		"secrets.existingSecret=my-keys", "secrets.keys.oidcClientSecret=client-secret",
		"providerCluster.externalAddress=https://api.example.com:6443",
		"providerCluster.externalServerName=api.internal",
		"providerCluster.externalCA="+ca,
		"prettyName=MangoDB Inc.: #1", "consumerScope=Cluster")
	if objs.find("Secret", fullname) != nil {
		t.Error("the chart made a Secret although secrets.existingSecret is set")
	}
	d := objs.get(t, "Deployment", fullname)
	for _, v := range asSlice(t, field(t, d, "spec", "template", "spec", "volumes")) {
		vv := asMap(t, v)
		if vv["name"] != "secrets" {
			continue
		}
		sec := asMap(t, vv["secret"])
		if sec["secretName"] != "my-keys" {
			t.Errorf("secrets volume from %v, want my-keys", sec["secretName"])
		}
		if items := asSlice(t, sec["items"]); asMap(t, items[0])["key"] != "client-secret" {
			t.Errorf("secret items %v: want the custom key name", items)
		}
	}
	f := flags(t, objs)
	for k, v := range map[string]string{
		"--oidc-issuer-client-secret-file": secretDir + "/client-secret",
		"--external-address":               "https://api.example.com:6443",
		"--external-server-name":           "api.internal",
		"--external-ca-file":               "/etc/kube-bind-backend/external-ca/ca.crt",
		"--pretty-name":                    "MangoDB Inc.: #1",
		"--consumer-scope":                 "Cluster",
	} {
		if f[k] != v {
			t.Errorf("flag %s = %q, want %q", k, f[k], v)
		}
	}
	cm := objs.get(t, "ConfigMap", fullname+"-external-ca")
	if got := field(t, cm, "data", "ca.crt"); strings.TrimSpace(got.(string)) != ca {
		t.Errorf("CA ConfigMap holds %q", got)
	}
}

func TestSchemaAndChecksRefuseBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets []string
		want []string // all must appear in helm's error
	}{
		{"zero replicas", []string{"replicaCount=0"}, []string{"/replicaCount", "minimum"}},
		{"bad consumer scope", []string{"consumerScope=Everything"}, []string{"/consumerScope", "Namespaced", "Cluster"}},
		{"typo in a value name", []string{"replicas=3"}, []string{"replicas", "additional properties"}},
		{"externalURL not a URL", []string{"externalURL=bind.example.com"}, []string{"/externalURL", "does not match pattern"}},
		{"bad duration", []string{"session.ttl=10 minutes"}, []string{"/session/ttl", "does not match pattern"}},
		{"bad session store", []string{"session.store=redis"}, []string{"/session/store", "ring"}},
		{"long poll wait not whole seconds", []string{"session.longPollMaxWait=1500ms"}, []string{"/session/longPollMaxWait", "does not match pattern"}},
		{"no long poll slots", []string{"session.maxLongPolls=0"}, []string{"/session/maxLongPolls", "minimum"}},
		{"bad log level", []string{"log.level=verbose"}, []string{"/log/level"}},
		{"plain http provider API", []string{"providerCluster.externalAddress=http://api:6443"}, []string{"/providerCluster/externalAddress"}},
		{"bad namespace prefix", []string{"namespacePrefix=Kube_Bind"}, []string{"/namespacePrefix"}},
		{"namespace prefix starting with a digit", []string{"namespacePrefix=1kb-"}, []string{"/namespacePrefix"}},
		{"memory store with replicas", []string{"session.store=memory", "replicaCount=3"},
			[]string{"session.store=memory with replicaCount=3", "use session.store=ring"}},
		{"TLS without a certificate", []string{"tls.enabled=true"}, []string{"tls.enabled needs a certificate"}},
		{"cert-manager without issuer", []string{"tls.enabled=true", "tls.certManager.enabled=true"}, []string{"tls.certManager.issuerRef.name is required"}},
		{"allow-list with the callback flow off", []string{"callbackFlow=false", "callbackAllowedURLs[0]=https://cli.example.com/cb"},
			[]string{"callbackAllowedURLs with callbackFlow=false"}},
		{"callback flow not a boolean", []string{"callbackFlow=maybe"}, []string{"/callbackFlow"}},
		{"HTTPRoute without gateway", []string{"httpRoute.enabled=true"}, []string{"httpRoute.enabled needs httpRoute.parentRefs"}},
		{"extra arg not a flag", []string{"extraArgs[0]=debug"}, []string{"/extraArgs/0"}},
		{"negative preStop sleep", []string{"preStopSleepSeconds=-1"}, []string{"/preStopSleepSeconds", "minimum"}},
		{"grace period shorter than preStop and drain", []string{"terminationGracePeriodSeconds=30"},
			[]string{"terminationGracePeriodSeconds=30 is too short", "preStopSleepSeconds=5", "shutdownTimeout=25s", "30s in all"}},
		{"drain as long as the grace period", []string{"shutdownTimeout=1m", "preStopSleepSeconds=0"},
			[]string{"terminationGracePeriodSeconds=60 is too short", "shutdownTimeout=1m", "60s in all"}},
		{"drain in hours", []string{"shutdownTimeout=1h"}, []string{"is too short", "3605s in all"}},
		{"diagnostics on the public port", []string{"diagnostics.port=8080"}, []string{"diagnostics.port=8080 is containerPort"}},
		{"diagnostics on the peer port", []string{"diagnostics.port=8081"}, []string{"diagnostics.port=8081 is ring.port"}},
		{"diagnostics port out of range", []string{"diagnostics.port=70000"}, []string{"/diagnostics/port"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderErr(t, setArgs(append(requiredValues(), tc.sets...))...)
			if err == nil {
				t.Fatalf("helm template accepted %v", tc.sets)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}

	// Each required value, left out, is named with an example.
	all := requiredValues()
	for i, missing := range []string{"externalURL is required", "oidc.issuerURL is required", "oidc.clientID is required", "the OIDC client secret is missing"} {
		t.Run("missing "+strings.Split(all[i], "=")[0], func(t *testing.T) {
			sets := append(append([]string{}, all[:i]...), all[i+1:]...)
			err := renderErr(t, setArgs(sets)...)
			if err == nil || !strings.Contains(err.Error(), missing) {
				t.Fatalf("want an error containing %q, got %v", missing, err)
			}
		})
	}
}

// The chart ships the same CRD files as deploy/crds, byte for byte.
func TestCRDsAreThoseOfDeployCRDs(t *testing.T) {
	root := procs.RepoRoot()
	want, _ := filepath.Glob(filepath.Join(root, "deploy", "crds", "*.yaml"))
	have, _ := filepath.Glob(filepath.Join(chartDir(t), "crds", "*.yaml"))
	base := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		sort.Strings(out)
		return out
	}
	if len(want) == 0 {
		t.Fatal("no CRDs in deploy/crds")
	}
	if !reflect.DeepEqual(base(want), base(have)) {
		t.Fatalf("chart CRDs %v differ from deploy/crds %v: copy deploy/crds/*.yaml to charts/kube-bind-backend/crds/", base(have), base(want))
	}
	for _, p := range want {
		a, _ := os.ReadFile(p)
		b, _ := os.ReadFile(filepath.Join(chartDir(t), "crds", filepath.Base(p)))
		if !bytes.Equal(a, b) {
			t.Errorf("charts/kube-bind-backend/crds/%s differs from deploy/crds: copy it again", filepath.Base(p))
		}
	}
}

// The chart's ClusterRoles are exactly what internal/binding expects.
func TestClusterRolesAreThoseOfBinding(t *testing.T) {
	objs := render(t)
	want := binding.ClusterRoles()
	if got := len(objs.ofKind("ClusterRole")); got != len(want) {
		t.Errorf("chart renders %d ClusterRoles, internal/binding has %d", got, len(want))
	}
	for _, w := range want {
		u := objs.get(t, "ClusterRole", w.Name)
		var got rbacv1.ClusterRole
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Rules, w.Rules) {
			t.Errorf("ClusterRole %s:\nchart:   %+v\nbinding: %+v", w.Name, got.Rules, w.Rules)
		}
	}
	for _, r := range objs.ofKind("ClusterRole") {
		for _, rule := range asSlice(t, field(t, r, "rules")) {
			m := asMap(t, rule)
			for _, k := range []string{"apiGroups", "resources", "verbs"} {
				for _, v := range asSlice(t, m[k]) {
					if v == "*" {
						t.Errorf("ClusterRole %s has a wildcard in %s", r.GetName(), k)
					}
				}
			}
		}
	}
}

// TestNetworkPolicy: by default the diagnostics port (every check's error,
// every metric) answers only the node's probes and the monitoring
// namespace, not every pod of the cluster.
func TestNetworkPolicy(t *testing.T) {
	objs := render(t, "networkPolicy.httpFrom[0].namespaceSelector.matchLabels.team=ingress")
	np := objs.get(t, "NetworkPolicy", fullname)
	rules := asSlice(t, field(t, np, "spec", "ingress"))
	if len(rules) != 3 {
		t.Fatalf("want a rule for the http port, the diagnostics port and the peer port, got %v", rules)
	}
	httpRule, diagRule, peerRule := asMap(t, rules[0]), asMap(t, rules[1]), asMap(t, rules[2])
	if p := asMap(t, asSlice(t, diagRule["ports"])[0]); p["port"] != "diagnostics" {
		t.Errorf("diagnostics rule %v: want port diagnostics", diagRule)
	}
	from := asSlice(t, diagRule["from"])
	if len(from) != 1 {
		t.Fatalf("diagnostics rule %v: want one peer by default", diagRule)
	}
	sel := asMap(t, asMap(t, asMap(t, from[0])["namespaceSelector"])["matchLabels"])
	if len(sel) != 1 || sel["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("diagnostics port open to %v by default, want only the monitoring namespace", from)
	}
	if p := asMap(t, asSlice(t, httpRule["ports"])[0]); p["port"] != "http" {
		t.Errorf("first rule ports %v", p)
	}
	if from := asMap(t, asSlice(t, httpRule["from"])[0]); from["namespaceSelector"] == nil {
		t.Errorf("http rule from %v: want the configured namespaceSelector", from)
	}
	if p := asMap(t, asSlice(t, peerRule["ports"])[0]); p["port"] != "peer" {
		t.Errorf("third rule ports %v", p)
	}
	peers := asMap(t, asMap(t, asMap(t, asSlice(t, peerRule["from"])[0])["podSelector"])["matchLabels"])
	if peers["app.kubernetes.io/instance"] != "kbb" {
		t.Errorf("peer port open to %v, want only this release's pods", peers)
	}
	// One replica: no peer port to open.
	one := render(t, "replicaCount=1")
	if n := len(asSlice(t, field(t, one.get(t, "NetworkPolicy", fullname), "spec", "ingress"))); n != 2 {
		t.Errorf("%d ingress rules for one replica, want 2 (http, diagnostics)", n)
	}
	// No peers for the diagnostics port: no rule opens it to any pod (a
	// rule without "from" would open it to every source).
	closed := render(t, "networkPolicy.diagnosticsFrom=null")
	for _, r := range asSlice(t, field(t, closed.get(t, "NetworkPolicy", fullname), "spec", "ingress")) {
		if p := asMap(t, asSlice(t, asMap(t, r)["ports"])[0]); p["port"] == "diagnostics" {
			t.Errorf("with no diagnosticsFrom the diagnostics port is still opened: %v", r)
		}
	}
	if n := len(render(t, "networkPolicy.enabled=false").ofKind("NetworkPolicy")); n != 0 {
		t.Errorf("%d NetworkPolicies with networkPolicy.enabled=false", n)
	}
}

func TestMountedSecretsAreReadOnlyAndGroupReadable(t *testing.T) {
	objs := render(t, "tls.enabled=true", "tls.existingSecret=tls")
	d := objs.get(t, "Deployment", fullname)
	for _, v := range asSlice(t, field(t, d, "spec", "template", "spec", "volumes")) {
		vv := asMap(t, v)
		if sec, ok := vv["secret"]; ok {
			// 0440: readable by the non-root user through fsGroup, by no one else.
			if mode := asMap(t, sec)["defaultMode"]; mode != int64(0o440) {
				t.Errorf("volume %v: defaultMode %v, want 0440", vv["name"], mode)
			}
		}
	}
	for _, m := range asSlice(t, container(t, objs)["volumeMounts"]) {
		mm := asMap(t, m)
		if mm["name"] != "tmp" && mm["readOnly"] != true {
			t.Errorf("mount %v is writable", mm["name"])
		}
	}
	if fs := field(t, d, "spec", "template", "spec", "securityContext", "fsGroup"); fs != int64(65532) {
		t.Errorf("fsGroup %v, want 65532 (the group that may read the secret files)", fs)
	}
}

// Probes, metrics and the status page have a port of their own in the pod,
// which neither the Service nor (through it) the Ingress or HTTPRoute
// expose; Prometheus finds it by the pod's annotations.
func TestDiagnosticsPortIsNotExposed(t *testing.T) {
	for _, sets := range [][]string{nil, {"diagnostics.port=9100", "tls.enabled=true", "tls.existingSecret=tls",
		"ingress.enabled=true", "httpRoute.enabled=true", "httpRoute.parentRefs[0].name=public"}} {
		objs := render(t, sets...)
		want := int64(9090)
		if sets != nil {
			want = 9100
		}
		c := container(t, objs)
		var diag map[string]any
		for _, p := range asSlice(t, c["ports"]) {
			if pm := asMap(t, p); pm["name"] == "diagnostics" {
				diag = pm
			}
		}
		if diag == nil || diag["containerPort"] != want {
			t.Errorf("%v: container port diagnostics %v, want %d", sets, diag, want)
		}
		if f := flags(t, objs); f["--diagnostics-address"] != fmt.Sprintf(":%d", want) {
			t.Errorf("%v: --diagnostics-address %q", sets, f["--diagnostics-address"])
		}
		for _, svc := range objs.ofKind("Service") {
			for _, p := range asSlice(t, field(t, svc, "spec", "ports")) {
				pm := asMap(t, p)
				if tp := pm["targetPort"]; tp == "diagnostics" || tp == want || pm["port"] == want {
					t.Errorf("%v: Service %s exposes the diagnostics port: %v", sets, svc.GetName(), pm)
				}
			}
		}
		ann := asMap(t, field(t, objs.get(t, "Deployment", fullname), "spec", "template", "metadata", "annotations"))
		if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != fmt.Sprint(want) || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("%v: pod annotations %v, want Prometheus scraping of port %d", sets, ann, want)
		}
		if sets != nil {
			ing := objs.get(t, "Ingress", fullname)
			b, _ := ing.MarshalJSON()
			if strings.Contains(string(b), "diagnostics") || strings.Contains(string(b), "9100") {
				t.Errorf("Ingress reaches the diagnostics port: %s", b)
			}
		}
	}
	off := render(t, "diagnostics.prometheusAnnotations=false")
	if _, has := asMap(t, field(t, off.get(t, "Deployment", fullname), "spec", "template", "metadata", "annotations"))["prometheus.io/scrape"]; has {
		t.Error("prometheus.io/scrape with diagnostics.prometheusAnnotations=false")
	}
}

// The admission policy's lists of what a consumer Role may hold are those
// the controllers build Roles from: binding.BuiltinGroups, the consumer
// verbs and offers.DefaultClaimableResources.
func TestScopePolicyListsAreThoseOfBinding(t *testing.T) {
	vap := render(t).get(t, "ValidatingAdmissionPolicy", fullname+"-scope")
	vars := map[string]string{}
	for _, v := range asSlice(t, field(t, vap, "spec", "variables")) {
		m := asMap(t, v)
		vars[m["name"].(string)] = m["expression"].(string)
	}
	quoted := func(items []string) string {
		q := make([]string, len(items))
		for i, s := range items {
			q[i] = "'" + s + "'"
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	var claimable []string
	for _, gr := range offers.DefaultClaimableResources {
		claimable = append(claimable, gr.Group+"/"+gr.Resource)
	}
	for name, want := range map[string][]string{
		"builtinGroups": binding.BuiltinGroups, "verbs": binding.ConsumerVerbs, "claimable": claimable,
	} {
		if got := strings.Join(strings.Fields(vars[name]), " "); got != quoted(want) {
			t.Errorf("the policy's %s is %s, want %s", name, got, quoted(want))
		}
	}
}

// The kbind v2 Lease namespace: the Roles are those of internal/binding,
// the grants name the groups and roles the backend's code and the policy
// expect, the policy file is rendered whole, and leases=false renders
// none of it.
func TestKbindV2LeasesAreThoseOfBinding(t *testing.T) {
	objs := render(t)
	for _, w := range binding.V2LeaseRoles() {
		u := objs.get(t, "Role", w.Name)
		var got rbacv1.Role
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &got); err != nil {
			t.Fatal(err)
		}
		if got.Namespace != binding.V2LeaseNamespace || !reflect.DeepEqual(got.Rules, w.Rules) {
			t.Errorf("Role %s:\nchart:   %s %+v\nbinding: %s %+v", w.Name, got.Namespace, got.Rules, w.Namespace, w.Rules)
		}
	}
	if ns := objs.get(t, "Namespace", binding.V2LeaseNamespace); ns == nil {
		t.Fatal("no Lease namespace")
	}
	for kind, name := range map[string]string{"ClusterRoleBinding": binding.V2KonnectorClusterRole, "RoleBinding": binding.V2LeaseRole} {
		rb := objs.get(t, kind, name)
		subjects := asSlice(t, field(t, rb, "subjects"))
		if len(subjects) != 1 || asMap(t, subjects[0])["name"] != binding.AllServiceAccounts || field(t, rb, "roleRef", "name") != name {
			t.Errorf("%s %s grants %v %v", kind, name, field(t, rb, "roleRef"), subjects)
		}
	}
	rb := objs.get(t, "RoleBinding", binding.BackendLeasesRole)
	if s := asMap(t, asSlice(t, field(t, rb, "subjects"))[0]); s["kind"] != "ServiceAccount" || s["name"] != fullname {
		t.Errorf("RoleBinding %s grants %v", binding.BackendLeasesRole, s)
	}
	for _, kind := range []string{"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		objs.get(t, kind, "kube-bind-v2-lease")
	}
	if q := objs.get(t, "ResourceQuota", "kube-bind-v2-leases"); field(t, q, "spec", "hard", "count/leases.coordination.k8s.io") != "20000" {
		t.Errorf("Lease quota %v", field(t, q, "spec", "hard"))
	}
	// The policy stamps the label the heartbeat controller reads.
	vap := objs.get(t, "ValidatingAdmissionPolicy", "kube-bind-v2-lease")
	if b, _ := json.Marshal(vap.Object); !strings.Contains(string(b), binding.LabelLeaseConsumer) {
		t.Errorf("the Lease policy does not name %s", binding.LabelLeaseConsumer)
	}

	off := render(t, "kbindV2.leases=false")
	for _, kind := range []string{"MutatingAdmissionPolicy", "ResourceQuota", "Namespace"} {
		if len(off.ofKind(kind)) != 0 {
			t.Errorf("kbindV2.leases=false renders a %s", kind)
		}
	}
}
