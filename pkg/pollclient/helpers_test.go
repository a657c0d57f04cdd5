package pollclient

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// kubeconfig returns a kubeconfig YAML for server and namespace, as a
// provider would issue it.
func kubeconfig(t testing.TB, server, namespace string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["provider"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: []byte("not-a-real-ca")}
	cfg.AuthInfos["consumer"] = &clientcmdapi.AuthInfo{Token: "sa-token"}
	cfg.Contexts["provider"] = &clientcmdapi.Context{Cluster: "provider", AuthInfo: "consumer", Namespace: namespace}
	cfg.CurrentContext = "provider"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// bindingResponse returns a valid BindingResponse for session sid.
func bindingResponse(t testing.TB, sid string) v1alpha1.BindingResponse {
	t.Helper()
	req, err := json.Marshal(v1alpha1.APIServiceExportRequestResponse{
		APIVersion: v1alpha1.GroupVersion,
		Kind:       v1alpha1.KindAPIServiceExportRequest,
		Metadata:   v1alpha1.NameMeta{Name: "mangodbs.mangodb.com"},
		Spec: v1alpha1.APIServiceExportRequestResponseSpec{
			Resources: []v1alpha1.APIServiceExportRequestResource{{Group: "mangodb.com", Resource: "mangodbs"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return v1alpha1.BindingResponse{
		APIVersion: v1alpha1.GroupVersion,
		Kind:       v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{
			OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: sid, ID: "https://issuer.example/alice"},
		},
		Kubeconfig: kubeconfig(t, "https://provider.example:6443", "kube-bind-abc"),
		Requests:   []json.RawMessage{req},
	}
}

// fakeTime replaces the client's clock and sleep: sleeping advances the
// clock at once and records the duration.
type fakeTime struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func installFakeTime(c *Client, start time.Time) *fakeTime {
	ft := &fakeTime{now: start}
	c.now = ft.Now
	c.sleep = ft.Sleep
	return ft
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sleeps = append(f.sleeps, d)
	f.now = f.now.Add(d)
	return nil
}

func (f *fakeTime) Sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}
