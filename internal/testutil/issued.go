package testutil

import (
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// IssuedConfig returns the connection and the namespace (its current
// context's) of a kubeconfig the backend issued to a consumer, as the
// konnector uses them, failing the test if it does not load.
func IssuedConfig(t tb.TB, kubeconfig []byte) (*rest.Config, string) {
	t.Helper()
	cc, err := clientcmd.NewClientConfigFromBytes(kubeconfig)
	if err != nil {
		t.Fatalf("issued kubeconfig: %v", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		t.Fatalf("issued kubeconfig: %v", err)
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		t.Fatalf("issued kubeconfig: %v", err)
	}
	return rc, ns
}
