package apply

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNewerKonnector(t *testing.T) {
	cases := []struct {
		want, running string
		replace       bool
	}{
		{"ghcr.io/kube-bind/konnector:v0.4.8", "ghcr.io/kube-bind/konnector:v0.4.8", false},
		{"ghcr.io/kube-bind/konnector:v0.4.8", "ghcr.io/kube-bind/konnector:v0.4.7", true},
		{"ghcr.io/kube-bind/konnector:v0.4.8", "ghcr.io/kube-bind/konnector:v0.5.0", false},
		{"ghcr.io/kube-bind/konnector:v0.4.8", "registry:5000/konnector:dev", true},
		{"registry:5000/konnector", "ghcr.io/kube-bind/konnector:v0.4.8", true},
	}
	for _, c := range cases {
		if got := newer(c.want, c.running); got != c.replace {
			t.Errorf("newer(%q, %q) = %v, want %v", c.want, c.running, got, c.replace)
		}
	}
}

func TestKonnectorClusterRoleNamesEachBoundAPI(t *testing.T) {
	cr := konnectorClusterRole([]GroupResource{{"mangodb.com", "mangodbs"}, {"cache.example.com", "redises"}, {"mangodb.com", "mangodbs"}})
	var all []string
	for _, r := range cr.Rules {
		b, _ := json.Marshal(r)
		all = append(all, string(b))
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if g == "*" || res == "*" {
					t.Errorf("wildcard rule %s", b)
				}
			}
		}
		for _, v := range r.Verbs {
			if v == "*" || (v == "delete" && r.APIGroups[0] == "apiextensions.k8s.io") {
				t.Errorf("rule %s grants %s", b, v)
			}
		}
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{`"resources":["mangodbs"]`, `"resources":["mangodbs/status"]`, `"resources":["redises"]`,
		`"resourceNames":["apiservicebindings.kube-bind.io","mangodbs.mangodb.com","redises.cache.example.com","mangodbs.mangodb.com"]`} {
		if !strings.Contains(joined, want) {
			t.Errorf("ClusterRole lacks %s:\n%s", want, joined)
		}
	}
	if strings.Count(joined, `"resources":["mangodbs"]`) != 1 {
		t.Errorf("a bound API named twice:\n%s", joined)
	}
}

func TestParseRequestsRefusesBadOnes(t *testing.T) {
	good := json.RawMessage(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"APIServiceExportRequest","metadata":{"name":"a.b"},"spec":{"resources":[{"group":"b","resource":"a"}]}}`)
	if _, err := parseRequests([]json.RawMessage{good}, genV1alpha1); err != nil {
		t.Fatal(err)
	}
	for name, raws := range map[string][]json.RawMessage{
		"none":         nil,
		"twice":        {good, good},
		"no name":      {json.RawMessage(`{"spec":{"resources":[{"group":"b","resource":"a"}]}}`)},
		"no resources": {json.RawMessage(`{"metadata":{"name":"a.b"},"spec":{}}`)},
		"slash":        {json.RawMessage(`{"metadata":{"name":"a.b"},"spec":{"resources":[{"group":"b","resource":"a/status"}]}}`)},
		"not JSON":     {json.RawMessage(`{`)},
	} {
		if _, err := parseRequests(raws, genV1alpha1); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestIdentitySecretNameIsPerProviderHost(t *testing.T) {
	a, _ := ProviderKey("https://Bind.Example.com/export")
	b, _ := ProviderKey("https://bind.example.com/other")
	c, _ := ProviderKey("https://bind.example.com:8443/export")
	if a != b || a == c || IdentitySecretName(a) != IdentitySecretName(b) || IdentitySecretName(a) == IdentitySecretName(c) {
		t.Errorf("keys %q %q %q", a, b, c)
	}
	if n := IdentitySecretName(a); len(n) > 63 || !strings.HasPrefix(n, identityPrefix) {
		t.Errorf("name %q", n)
	}
	if _, err := ProviderKey("not a url"); err == nil {
		t.Error("ProviderKey accepted a URL without host")
	}
}

func TestParseRequestsChecksTheGeneration(t *testing.T) {
	v2 := json.RawMessage(`{"apiVersion":"kube-bind.io/v1alpha2","kind":"APIServiceExportRequest","metadata":{"name":"cowboys"},
		"spec":{"resources":[{"group":"wild.west","resource":"cowboys","versions":["v1"]}],
		"permissionClaims":[{"group":"","resource":"secrets","selector":{"labelSelector":{"matchLabels":{"app":"cowboy"}}}}],
		"namespaces":[{"name":"ranch"}]}}`)
	v1 := json.RawMessage(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"APIServiceExportRequest","metadata":{"name":"a.b"},"spec":{"resources":[{"group":"b","resource":"a"}]}}`)
	reqs, err := parseRequests([]json.RawMessage{v2}, genV1alpha2)
	if err != nil {
		t.Fatal(err)
	}
	r := reqs[0]
	if r.name != "cowboys" || len(r.resources) != 1 || r.resources[0].Name() != "cowboys.wild.west" ||
		len(r.claims) != 1 || r.claims[0] != (GroupResource{Resource: "secrets"}) || !r.namespaces {
		t.Errorf("parsed %+v", r)
	}
	if _, err := parseRequests([]json.RawMessage{v1}, genV1alpha2); err == nil {
		t.Error("a v1alpha1 request accepted in a v1alpha2 binding")
	}
	if _, err := parseRequests([]json.RawMessage{v2}, genV1alpha1); err == nil {
		t.Error("a v1alpha2 request accepted in a v1alpha1 binding")
	}
	bad := json.RawMessage(strings.Replace(string(v2), `"resource":"secrets"`, `"resource":"*"`, 1))
	if _, err := parseRequests([]json.RawMessage{bad}, genV1alpha2); err == nil {
		t.Error("a claim on * accepted")
	}
}

func TestKonnectorGenerationByTag(t *testing.T) {
	for image, want := range map[string]string{
		DefaultKonnector:                       ProtocolV1alpha1,
		DefaultKonnectorV1alpha2:               ProtocolV1alpha2,
		"ghcr.io/kbind-dev/konnector:v0.7.1":   ProtocolV1alpha2,
		"ghcr.io/kube-bind/konnector:v0.4.7":   ProtocolV1alpha1,
		"registry:5000/konnector:dev":          "fallback",
		"registry:5000/konnector@sha256:abcd0": "fallback",
	} {
		fallback := generation{protocol: "fallback"}
		if got := konnectorGeneration(image, fallback).protocol; got != want {
			t.Errorf("konnectorGeneration(%q) = %s, want %s", image, got, want)
		}
	}
	// The v0.4.8 konnector is replaced by v0.8.2 across the renamed
	// repositories, never the other way.
	if !newer(DefaultKonnectorV1alpha2, DefaultKonnector) || newer(DefaultKonnector, DefaultKonnectorV1alpha2) {
		t.Error("newer does not order v0.4.8 and v0.8.2")
	}
}

func TestKonnectorClusterRoleV1alpha2(t *testing.T) {
	rules := func(bs boundState) string {
		cr := konnectorClusterRoleV1alpha2(bs)
		var all []string
		for _, r := range cr.Rules {
			b, _ := json.Marshal(r)
			all = append(all, string(b))
			for _, x := range append(append(append([]string(nil), r.APIGroups...), r.Resources...), r.Verbs...) {
				if x == "*" {
					t.Errorf("wildcard in rule %s", b)
				}
			}
			if slices.Contains(r.Verbs, "delete") && (slices.Contains(r.Resources, "customresourcedefinitions") || slices.Contains(r.Resources, "apiservicebindings")) {
				t.Errorf("rule %s deletes", b)
			}
			if slices.Contains(r.Resources, "apiservicebindings") && slices.Contains(r.Verbs, "create") {
				t.Errorf("rule %s creates bindings", b)
			}
		}
		return strings.Join(all, "\n")
	}
	plain := rules(boundState{bound: []GroupResource{{"mangodb.com", "mangodbs"}}})
	for _, want := range []string{
		`"resourceNames":["apiservicebindings.kube-bind.io","apiservicebindingbundles.kube-bind.io","mangodbs.mangodb.com"]`,
		`"resources":["apiservicebindings","apiservicebindingbundles"]`,
		`{"verbs":["get","list","watch","create","update","patch","delete"],"apiGroups":["mangodb.com"],"resources":["mangodbs"]}`,
		`"resources":["mangodbs/status"]`,
		`{"verbs":["get","list","watch"],"apiGroups":[""],"resources":["namespaces"]}`,
		`{"verbs":["list","watch"],"apiGroups":[""],"resources":["secrets"]}`,
	} {
		if !strings.Contains(plain, want) {
			t.Errorf("ClusterRole lacks %s:\n%s", want, plain)
		}
	}
	if strings.Contains(plain, "events") {
		t.Errorf("konnector v0.8 records no events, yet:\n%s", plain)
	}
	claims := rules(boundState{bound: []GroupResource{{"mangodb.com", "mangodbs"}}, claims: []GroupResource{{"", "secrets"}, {"", "configmaps"}}, namespaces: true})
	for _, want := range []string{
		`{"verbs":["get","list","watch","create","update","patch","delete"],"apiGroups":[""],"resources":["configmaps","secrets"]}`,
		`{"verbs":["get","list","watch","create"],"apiGroups":[""],"resources":["namespaces"]}`,
	} {
		if !strings.Contains(claims, want) {
			t.Errorf("ClusterRole with claims and namespaces lacks %s:\n%s", want, claims)
		}
	}
	if strings.Contains(claims, `"configmaps/status"`) {
		t.Errorf("claimed resources get status rights:\n%s", claims)
	}
}

func TestKonnectorDeploymentV1alpha2(t *testing.T) {
	d := konnectorDeploymentOf(genV1alpha2, DefaultKonnectorV1alpha2)
	if d.Name != KonnectorName || d.Namespace != Namespace || d.Spec.Selector.MatchLabels["app"] != KonnectorName {
		t.Errorf("the released CLI looks for Deployment %s/%s with app=%s: %s/%s %v", Namespace, KonnectorName, KonnectorName, d.Namespace, d.Name, d.Spec.Selector)
	}
	ps := d.Spec.Template.Spec
	c := ps.Containers[0]
	if c.Image != DefaultKonnectorV1alpha2 || !slices.Contains(c.Args, "--server-address=:8090") {
		t.Errorf("container %s %v", c.Image, c.Args)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != 8090 || p.HTTPGet.Path != "/healthz" {
			t.Errorf("probe %+v, want GET /healthz :8090", p)
		}
	}
	if ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot || ps.SecurityContext.RunAsUser == nil || *ps.SecurityContext.RunAsUser == 0 {
		t.Errorf("pod security %+v: non-root needs a user (the image would run as root)", ps.SecurityContext)
	}
	if sc := c.SecurityContext; sc == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("container security %+v", sc)
	}
	if v1 := konnectorDeploymentOf(genV1alpha1, DefaultKonnector); v1.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Port.IntValue() != 8080 {
		t.Error("the v0.4.8 Deployment changed its health port")
	}
}
