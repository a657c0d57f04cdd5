// Package issued reads, in tests, a kubeconfig the backend issued to a
// consumer: the connection it configures and the consumer's provider
// namespace (its current context's), as the konnector uses them.
package issued

import (
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config returns the connection and the namespace of kubeconfig, failing
// the test if it does not load.
func Config(t testing.TB, kubeconfig []byte) (*rest.Config, string) {
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
