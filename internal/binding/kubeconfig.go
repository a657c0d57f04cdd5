package binding

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// endpoint is how consumers reach the provider API server: what the issued
// kubeconfigs point at.
type endpoint struct {
	server     string
	caData     []byte
	serverName string
}

// resolveEndpoint picks the external address and CA when configured, else
// the backend's own connection (right when consumers reach the cluster the
// same way, e.g. a local demo; in a pod the in-cluster host is private, so
// production sets ExternalAddress).
func resolveEndpoint(cfg Config, rc *rest.Config) (endpoint, error) {
	ep := endpoint{server: cfg.ExternalAddress, serverName: cfg.ExternalServerName}
	if ep.server == "" {
		ep.server = rc.Host
		if ep.serverName == "" {
			ep.serverName = rc.ServerName
		}
	}
	if ep.server == "" {
		return endpoint{}, errors.New("no provider API server address: set the external address")
	}
	if !strings.Contains(ep.server, "://") {
		ep.server = "https://" + ep.server
	}
	switch {
	case len(cfg.ExternalCA) > 0:
		if err := CheckCABundle(cfg.ExternalCA); err != nil {
			return endpoint{}, err
		}
		ep.caData = cfg.ExternalCA
	case len(rc.CAData) > 0:
		ep.caData = rc.CAData
	case rc.CAFile != "":
		b, err := os.ReadFile(rc.CAFile)
		if err != nil {
			return endpoint{}, fmt.Errorf("reading the provider cluster's CA file: %w", err)
		}
		ep.caData = b
	}
	return ep, nil
}

// CheckCABundle checks an external CA bundle (--external-ca-file): it
// must hold at least one PEM certificate.
func CheckCABundle(pem []byte) error {
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return errors.New("no PEM certificate in it")
	}
	return nil
}

// Names inside an issued kubeconfig.
const (
	kubeconfigCluster = "provider"
	kubeconfigUser    = "kube-bind"
	kubeconfigContext = "provider"
)

// kubeconfig renders the kubeconfig a consumer's konnector uses: one
// cluster, one token user, one context whose namespace is the consumer's
// provider namespace.
func (ep endpoint) kubeconfig(namespace, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[kubeconfigCluster] = &clientcmdapi.Cluster{
		Server:                   ep.server,
		CertificateAuthorityData: ep.caData,
		TLSServerName:            ep.serverName,
	}
	cfg.AuthInfos[kubeconfigUser] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[kubeconfigContext] = &clientcmdapi.Context{
		Cluster:   kubeconfigCluster,
		AuthInfo:  kubeconfigUser,
		Namespace: namespace,
	}
	cfg.CurrentContext = kubeconfigContext
	return clientcmd.Write(*cfg)
}
