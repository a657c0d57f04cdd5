package v1alpha2

import (
	"encoding/json"
	"errors"
	"slices"

	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// The v1alpha2 sessions pick offers and get one request per pick.
func init() {
	lifecycle.Register(lifecycle.Generation{Name: lifecycle.V1alpha2, Render: Render, PicksOffers: true})
}

// Render renders a bind's result as the kube-bind.io/v1alpha2
// BindingResponse: one
// APIServiceExportRequest per pick, named after it, copying the offer's
// resources, claims, namespaces and schema update policy; the consumer's
// provider namespace; the first request's name as bindingName.
func Render(r lifecycle.Result) ([]byte, error) {
	if len(r.Picks) == 0 {
		return nil, errors.New("v1alpha2: a response with no picked offer")
	}
	resp := v1alpha2.BindingResponse{
		APIVersion: v1alpha2.GroupVersion,
		Kind:       v1alpha2.KindBindingResponse,
		Authentication: v1alpha2.BindingAuthentication{
			OAuth2CodeGrant: &v1alpha2.CodeGrantAuthentication{SessionID: r.SessionID, ID: r.ConsumerID},
		},
		Kubeconfig:        r.Kubeconfig,
		ProviderNamespace: r.Namespace,
		BindingName:       r.Picks[0].RequestName(),
	}
	for _, p := range r.Picks {
		raw, err := json.Marshal(Request(p.RequestName(), p.Offer))
		if err != nil {
			return nil, err
		}
		resp.Requests = append(resp.Requests, raw)
	}
	return json.Marshal(resp)
}

// Request is the APIServiceExportRequest a consumer creates for offer o,
// named name.
func Request(name string, o offers.Offer) v1alpha2.APIServiceExportRequestResponse {
	return v1alpha2.APIServiceExportRequestResponse{
		APIVersion: v1alpha2.GroupVersion,
		Kind:       v1alpha2.KindAPIServiceExportRequest,
		Metadata:   v1alpha2.NameMeta{Name: name},
		Spec: v1alpha2.APIServiceExportRequestSpec{
			Resources:          cloneResources(o.Resources),
			PermissionClaims:   slices.Clone(o.PermissionClaims),
			Namespaces:         slices.Clone(o.Namespaces),
			SchemaUpdatePolicy: o.SchemaUpdatePolicy,
		},
	}
}

func cloneResources(rs []v1alpha2.Resource) []v1alpha2.Resource {
	out := make([]v1alpha2.Resource, len(rs))
	for i, r := range rs {
		out[i] = v1alpha2.Resource{Group: r.Group, Resource: r.Resource, Versions: slices.Clone(r.Versions)}
	}
	return out
}
