package pollclient

import (
	"encoding/json"
	"fmt"
	"net/http"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Result is a BindingResponse that passed validation.
type Result struct {
	// Response is the decoded BindingResponse.
	Response v1alpha1.BindingResponse
	// Raw is the answer's body exactly as the provider sent it.
	Raw []byte
	// Server and Namespace are read from the kubeconfig's current context:
	// the provider cluster and the consumer's provider namespace.
	Server    string
	Namespace string
}

func (s *Session) decodeResult(resp *http.Response, body []byte) (*Result, error) {
	var br v1alpha1.BindingResponse
	if err := decodeJSON(resp, body, &br); err != nil {
		return nil, fmt.Errorf("binding response: %w", err)
	}
	res, err := ValidateBindingResponse(&br, s.ID)
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
	fail := func(format string, args ...any) (*Result, error) {
		return nil, fmt.Errorf("%w: binding response: %s", ErrInvalidResponse, fmt.Sprintf(format, args...))
	}
	if br.APIVersion != v1alpha1.GroupVersion || br.Kind != v1alpha1.KindBindingResponse {
		return fail("it is %q %q, want %q %q", br.APIVersion, br.Kind, v1alpha1.GroupVersion, v1alpha1.KindBindingResponse)
	}
	auth := br.Authentication.OAuth2CodeGrant
	if auth == nil {
		return fail("authentication.oauth2CodeGrant is missing")
	}
	if auth.SessionID != sessionID {
		return fail("it belongs to session %q, not to this session %q", auth.SessionID, sessionID)
	}
	for i, raw := range br.Requests {
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(raw, &tm); err != nil {
			return fail("requests[%d]: %v", i, err)
		}
		if tm.APIVersion != v1alpha1.GroupVersion || tm.Kind != v1alpha1.KindAPIServiceExportRequest {
			return fail("requests[%d] is %q %q, want %q %q", i, tm.APIVersion, tm.Kind, v1alpha1.GroupVersion, v1alpha1.KindAPIServiceExportRequest)
		}
	}
	if len(br.Kubeconfig) == 0 {
		return fail("kubeconfig is missing")
	}
	cfg, err := clientcmd.Load(br.Kubeconfig)
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
	return &Result{Response: *br, Server: cluster.Server, Namespace: kctx.Namespace}, nil
}
