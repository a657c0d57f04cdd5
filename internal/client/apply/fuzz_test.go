package apply

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzParseRequests: whatever requests a provider's BindingResponse
// carries, a parsed one is of the generation asked for, has a unique name
// the API servers accept and at least one resource, and no resource or
// group with a path separator, space or wildcard.
func FuzzParseRequests(f *testing.F) {
	f.Add(`[{"apiVersion":"kube-bind.io/v1alpha1","kind":"APIServiceExportRequest","metadata":{"name":"mangodbs.mangodb.com"},"spec":{"resources":[{"group":"mangodb.com","resource":"mangodbs"}]}}]`, false)
	f.Add(`[{"apiVersion":"kube-bind.io/v1alpha2","kind":"APIServiceExportRequest","metadata":{"name":"db"},"spec":{"resources":[{"group":"mangodb.com","resource":"mangodbs"}],"permissionClaims":[{"resource":"secrets"}],"namespaces":[{"name":"a"}]}}]`, true)
	f.Add(`[{"apiVersion":"kube-bind.io/v1alpha2","metadata":{"name":"../x"},"spec":{"resources":[{"resource":"*"}]}}]`, true)
	f.Add(`[1,null,{}]`, false)
	f.Fuzz(func(t *testing.T, requests string, v2 bool) {
		var raws []json.RawMessage
		if json.Unmarshal([]byte(requests), &raws) != nil {
			return
		}
		gen := genV1alpha1
		if v2 {
			gen = genV1alpha2
		}
		reqs, err := parseRequests(raws, gen)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for i, r := range reqs {
			if got := r.raw["apiVersion"]; got != gen.groupVersion {
				t.Fatalf("requests[%d] of %v accepted as %s", i, got, gen.groupVersion)
			}
			if errs := validation.IsDNS1123Subdomain(r.name); len(errs) > 0 || seen[r.name] {
				t.Fatalf("requests[%d]: name %q accepted (%v, repeated %v)", i, r.name, errs, seen[r.name])
			}
			seen[r.name] = true
			if len(r.resources) == 0 {
				t.Fatalf("requests[%d] accepted without resources", i)
			}
			for _, gr := range append(append([]GroupResource(nil), r.resources...), r.claims...) {
				if gr.Resource == "" || strings.ContainsAny(gr.Resource+gr.Group, "/ *") {
					t.Fatalf("requests[%d]: resource %q group %q accepted", i, gr.Resource, gr.Group)
				}
			}
		}
	})
}
