package v1alpha1

import (
	"testing"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// TestRender pins the v1alpha1 response byte for byte.
func TestRender(t *testing.T) {
	got, err := Render(lifecycle.Result{SessionID: "sid-1", Result: binding.Result{
		Namespace: "kb-abc", Kubeconfig: []byte("apiVersion: v1\n"), ConsumerID: "https://idp/alice",
		APIs: []binding.ExportedAPI{
			{Group: "mangodb.com", Resource: "mangodbs", Versions: []string{"v1", "v2"}},
			{Group: "", Resource: "widgets"},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"apiVersion":"kube-bind.io/v1alpha1","kind":"BindingResponse",` +
		`"authentication":{"oauth2CodeGrant":{"sid":"sid-1","id":"https://idp/alice"}},"kubeconfig":"YXBpVmVyc2lvbjogdjEK",` +
		`"requests":[{"apiVersion":"kube-bind.io/v1alpha1","kind":"APIServiceExportRequest","metadata":{"name":"mangodbs.mangodb.com"},` +
		`"spec":{"resources":[{"group":"mangodb.com","resource":"mangodbs","versions":["v1","v2"]}]}},` +
		`{"apiVersion":"kube-bind.io/v1alpha1","kind":"APIServiceExportRequest","metadata":{"name":"widgets."},` +
		`"spec":{"resources":[{"group":"","resource":"widgets"}]}}]}`
	if string(got) != want {
		t.Errorf("v1alpha1 response\n got %s\nwant %s", got, want)
	}
}
