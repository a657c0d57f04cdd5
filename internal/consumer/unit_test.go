package consumer

import (
	"encoding/json"
	"strings"
	"testing"
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
	if _, err := parseRequests([]json.RawMessage{good}); err != nil {
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
		if _, err := parseRequests(raws); err == nil {
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
