package pollclient

import (
	"encoding/json"
	"fmt"
	"net/http"

	"k8s.io/client-go/tools/clientcmd"
	kjson "sigs.k8s.io/json"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// Result is a BindingResponse that passed validation.
type Result struct {
	// Response is the decoded BindingResponse: the fields both protocol
	// generations share (a v1alpha2 response keeps its apiVersion
	// kube-bind.io/v1alpha2 here; Raw has all of it).
	Response v1alpha1.BindingResponse
	// Raw is the answer's body exactly as the provider sent it.
	Raw []byte
	// Server and Namespace are read from the kubeconfig's current context:
	// the provider cluster and the consumer's provider namespace.
	Server    string
	Namespace string
	// Generation is the response's protocol generation
	// (v1alpha1.ProviderAPIVersion or v1alpha2.ProviderAPIVersion); its
	// requests are APIServiceExportRequests of that generation.
	Generation string
	// ProviderNamespace and BindingName are what a v1alpha2 response
	// states besides (informational; empty in v1alpha1).
	ProviderNamespace string
	BindingName       string
}

func (s *Session) decodeResult(resp *http.Response, body []byte) (*Result, error) {
	var (
		res *Result
		err error
	)
	if s.provider.Generation == v1alpha2.ProviderAPIVersion {
		var br v1alpha2.BindingResponse
		if err := decodeJSON(resp, body, &br); err != nil {
			return nil, fmt.Errorf("binding response: %w", err)
		}
		res, err = ValidateV1alpha2BindingResponse(&br, s.ID)
	} else {
		var br v1alpha1.BindingResponse
		if err := decodeJSON(resp, body, &br); err != nil {
			return nil, fmt.Errorf("binding response: %w", err)
		}
		res, err = ValidateBindingResponse(&br, s.ID)
	}
	if err != nil {
		return nil, err
	}
	res.Raw = body
	return res, nil
}

// ValidateBindingResponse checks br as released kube-bind CLIs do, for the
// session sessionID: apiVersion and kind, the session in
// authentication.oauth2CodeGrant.sid, every request an
// APIServiceExportRequest of kube-bind.io/v1alpha1, and a kubeconfig whose
// current context names a cluster with a server and a namespace. Errors
// match ErrInvalidResponse.
func ValidateBindingResponse(br *v1alpha1.BindingResponse, sessionID string) (*Result, error) {
	res, err := validateResponse(v1alpha1.GroupVersion, br.APIVersion, br.Kind, br.Authentication, br.Kubeconfig, br.Requests, sessionID)
	if err != nil {
		return nil, err
	}
	res.Response = *br
	res.Generation = v1alpha1.ProviderAPIVersion
	return res, nil
}

// ValidateV1alpha2BindingResponse is ValidateBindingResponse for a
// kube-bind.io/v1alpha2 BindingResponse: the same checks, with apiVersion
// kube-bind.io/v1alpha2 for the response and every request (a response of
// the other generation is refused, whatever its shape).
func ValidateV1alpha2BindingResponse(br *v1alpha2.BindingResponse, sessionID string) (*Result, error) {
	res, err := validateResponse(v1alpha2.GroupVersion, br.APIVersion, br.Kind, br.Authentication, br.Kubeconfig, br.Requests, sessionID)
	if err != nil {
		return nil, err
	}
	res.Response = v1alpha1.BindingResponse{
		APIVersion: br.APIVersion, Kind: br.Kind, Authentication: br.Authentication,
		Kubeconfig: br.Kubeconfig, Requests: br.Requests,
	}
	res.Generation = v1alpha2.ProviderAPIVersion
	res.ProviderNamespace, res.BindingName = br.ProviderNamespace, br.BindingName
	return res, nil
}

func validateResponse(groupVersion, apiVersion, kind string, authn v1alpha1.BindingAuthentication, kubeconfig []byte,
	requests []json.RawMessage, sessionID string) (*Result, error) {
	fail := func(format string, args ...any) (*Result, error) {
		return nil, fmt.Errorf("%w: binding response: %s", ErrInvalidResponse, fmt.Sprintf(format, args...))
	}
	if apiVersion != groupVersion || kind != v1alpha1.KindBindingResponse {
		return fail("it is %q %q, want %q %q", apiVersion, kind, groupVersion, v1alpha1.KindBindingResponse)
	}
	auth := authn.OAuth2CodeGrant
	if auth == nil {
		return fail("authentication.oauth2CodeGrant is missing")
	}
	if auth.SessionID != sessionID {
		return fail("it belongs to session %q, not to this session %q", auth.SessionID, sessionID)
	}
	for i, raw := range requests {
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		// Case-sensitive, as the request is passed on as it is.
		if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &tm); err != nil {
			return fail("requests[%d]: %v", i, err)
		}
		if tm.APIVersion != groupVersion || tm.Kind != v1alpha1.KindAPIServiceExportRequest {
			return fail("requests[%d] is %q %q, want %q %q", i, tm.APIVersion, tm.Kind, groupVersion, v1alpha1.KindAPIServiceExportRequest)
		}
	}
	if len(kubeconfig) == 0 {
		return fail("kubeconfig is missing")
	}
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return fail("kubeconfig: %v", err)
	}
	kctx, ok := cfg.Contexts[cfg.CurrentContext]
	if cfg.CurrentContext == "" || !ok || kctx == nil {
		return fail("kubeconfig has no current context")
	}
	cluster, ok := cfg.Clusters[kctx.Cluster]
	if !ok || cluster == nil || cluster.Server == "" {
		return fail("kubeconfig's current context %q has no cluster with a server", cfg.CurrentContext)
	}
	if kctx.Namespace == "" {
		return fail("kubeconfig's current context %q has no namespace", cfg.CurrentContext)
	}
	return &Result{Server: cluster.Server, Namespace: kctx.Namespace}, nil
}
