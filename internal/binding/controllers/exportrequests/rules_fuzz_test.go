package exportrequests

import (
	"encoding/json"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// FuzzClaimRules feeds a consumer's request spec (as the API server may
// store it) to the Role builders: every rule they make passes
// binding.CheckConsumerRule; a claims rule names exactly one claimable
// resource, spelled as the provider spelled it, with claimVerbs, and only
// one the spec claims; an exports rule is a namespaced CRD's group and
// plural outside the built-in groups.
func FuzzClaimRules(f *testing.F) {
	for _, seed := range []string{
		`{"resources":[{"group":"mangodb.com","resource":"mangodbs"}],"permissionClaims":[{"group":"","resource":"secrets","selector":{}}]}`,
		`{"resources":[{"group":"*","resource":"*"}],"permissionClaims":[{"group":"*","resource":"*","selector":{}}]}`,
		`{"resources":[{"group":"apps","resource":"deployments"}],"permissionClaims":[{"group":"","resource":"Secrets"},{"group":"","resource":"pods"},{"group":" ","resource":"secrets"}]}`,
	} {
		f.Add([]byte(seed))
	}
	claimable := offers.DefaultClaimableResources
	f.Fuzz(func(t *testing.T, raw []byte) {
		var spec v1alpha2.APIServiceExportRequestSpec
		if json.Unmarshal(raw, &spec) != nil {
			return
		}
		for _, rule := range claimRules([]*wantedExport{{spec: spec}}, claimable) {
			if err := binding.CheckConsumerRule(rule, claimable); err != nil {
				t.Fatalf("claims rule %s: %v", rule.String(), err)
			}
			if len(rule.APIGroups) != 1 || len(rule.Resources) != 1 || !slices.Equal(rule.Verbs, claimVerbs) {
				t.Fatalf("claims rule %s is not one claimable resource with the claim verbs", rule.String())
			}
			gr := schema.GroupResource{Group: rule.APIGroups[0], Resource: rule.Resources[0]}
			if !slices.Contains(claimable, gr) {
				t.Fatalf("claims rule on %v, which is not claimable", gr)
			}
			if !slices.ContainsFunc(spec.PermissionClaims, func(c v1alpha2.PermissionClaim) bool {
				return c.Group == gr.Group && c.Resource == gr.Resource
			}) {
				t.Fatalf("claims rule on %v, which the spec does not claim", gr)
			}
		}
		var crds []*apiextensionsv1.CustomResourceDefinition
		for _, r := range spec.Resources {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			crd.Spec.Group, crd.Spec.Names.Plural, crd.Spec.Scope = r.Group, r.Resource, apiextensionsv1.NamespaceScoped
			crds = append(crds, crd)
		}
		for _, rule := range consumerRules(crds) {
			if binding.IsBuiltinGroup(rule.APIGroups[0]) {
				t.Fatalf("exports rule %s names a built-in group", rule.String())
			}
			if rule.APIGroups[0] == "*" || rule.Resources[0] == "*" {
				t.Fatalf("exports rule %s holds a wildcard", rule.String())
			}
		}
	})
}
