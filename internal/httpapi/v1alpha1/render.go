package v1alpha1

import (
	"encoding/json"

	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// The v1alpha1 sessions pick APIs of the catalog and get one request per
// resolved API.
func init() {
	lifecycle.Register(lifecycle.Generation{Name: lifecycle.V1alpha1, Render: Render})
}

// Render renders a bind's result as the kube-bind.io/v1alpha1
// BindingResponse: one request per resolved API, named <resource>.<group>.
func Render(r lifecycle.Result) ([]byte, error) {
	resp := v1alpha1.BindingResponse{
		APIVersion: v1alpha1.GroupVersion,
		Kind:       v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{
			OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: r.SessionID, ID: r.ConsumerID},
		},
		Kubeconfig: r.Kubeconfig,
	}
	for _, api := range r.APIs {
		raw, err := json.Marshal(v1alpha1.APIServiceExportRequestResponse{
			APIVersion: v1alpha1.GroupVersion,
			Kind:       v1alpha1.KindAPIServiceExportRequest,
			Metadata:   v1alpha1.NameMeta{Name: api.Resource + "." + api.Group},
			Spec: v1alpha1.APIServiceExportRequestResponseSpec{
				Resources: []v1alpha1.APIServiceExportRequestResource{{
					Group: api.Group, Resource: api.Resource, Versions: api.Versions,
				}},
			},
		})
		if err != nil {
			return nil, err
		}
		resp.Requests = append(resp.Requests, raw)
	}
	return json.Marshal(resp)
}
