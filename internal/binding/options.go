package binding

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Options are the flags of the provider cluster: how to reach it, what
// consumers may bind there and what they get, and the admission policy
// that confines the backend there.
type Options struct {
	Kubeconfig, Context string
	// ExternalAddress, ExternalCA (the content of --external-ca-file, set
	// by Complete) and ExternalServerName go into issued kubeconfigs
	// (Config).
	ExternalAddress    string
	ExternalCA         []byte
	ExternalServerName string
	NamespacePrefix    string
	// ConsumerScope is set by Complete.
	ConsumerScope Scope
	Quota         Quota
	// MaxClustersPerUser caps the provider namespaces of one user
	// (Config.MaxClustersPerUser).
	MaxClustersPerUser int
	// AdmissionPolicy names the ValidatingAdmissionPolicy that confines the
	// backend to the namespaces it made (internal/binding/scopecheck); ""
	// (set by Complete with --unsafe-skip-admission-policy-check) checks
	// nothing.
	AdmissionPolicy string

	externalCAFile, consumerScope  string
	unsafeSkipAdmissionPolicyCheck bool
}

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	s := fs.StringVar
	s(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the provider cluster (default: in-cluster configuration, else $KUBECONFIG)")
	s(&o.Context, "context", "", "context of the kubeconfig to use (default: its current context)")
	s(&o.ExternalAddress, "external-address", "", "API server address put into issued kubeconfigs (default: the provider cluster's)")
	s(&o.externalCAFile, "external-ca-file", "", "PEM CA bundle put into issued kubeconfigs (default: the provider cluster's)")
	s(&o.ExternalServerName, "external-server-name", "", "TLS server name put into issued kubeconfigs")
	s(&o.NamespacePrefix, "namespace-prefix", "kube-bind-", "prefix of the provider namespaces made for consumers")
	s(&o.consumerScope, "consumer-scope", "Namespaced", "scope of resources consumers may bind: Namespaced or Cluster")
	fs.IntVar(&o.Quota.ExportRequests, "consumer-max-export-requests", DefaultMaxExportRequests,
		"how many APIServiceExportRequests one consumer may have in its provider namespace (a ResourceQuota made at each bind)")
	fs.IntVar(&o.Quota.Namespaces, "consumer-max-namespaces", DefaultMaxNamespaces,
		"how many APIServiceNamespaces, and so provider namespaces, one consumer may have (a ResourceQuota made at each bind)")
	fs.IntVar(&o.MaxClustersPerUser, "max-clusters-per-user", DefaultMaxClustersPerUser,
		"how many consumer clusters (each a provider namespace) one user of the identity provider (issuer and subject) may bind, across every flow; a bind of a new cluster beyond it is refused, a rebind never (1 to 10000)")
	s(&o.AdmissionPolicy, "admission-policy", "kube-bind-backend-scope", "name of the ValidatingAdmissionPolicy confining the backend to the namespaces it made (the chart's <release>-scope); at start the backend proves with dry-run requests that it is in force and refuses to start where it is not, and the leader checks again every 5 minutes")
	fs.BoolVar(&o.unsafeSkipAdmissionPolicyCheck, "unsafe-skip-admission-policy-check", false, "UNSAFE: start without proving that --admission-policy confines the backend; without that policy whoever takes over the backend can grant itself Secrets and ServiceAccount tokens in any namespace and delete any namespace. Only for a backend that runs as a cluster admin anyway (local demos, tests)")
}

// Complete reads the CA file and checks the flags; errors name them.
func (o *Options) Complete() error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := o.Quota.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateMaxClustersPerUser(o.MaxClustersPerUser); err != nil {
		fail("--max-clusters-per-user: %v", err)
	}
	if o.externalCAFile != "" {
		b, err := os.ReadFile(o.externalCAFile)
		if err == nil {
			err = CheckCABundle(b)
		}
		if err != nil {
			fail("--external-ca-file %s: %v", o.externalCAFile, err)
		} else {
			o.ExternalCA = b
		}
	}
	if o.ExternalAddress != "" {
		if u, err := url.Parse(o.ExternalAddress); err != nil || u.Scheme != "https" || u.Host == "" {
			fail("--external-address %q: want the https URL of the provider's API server, e.g. https://api.example.com:6443", o.ExternalAddress)
		}
	}
	if err := ValidatePrefix(o.NamespacePrefix); err != nil {
		fail("--namespace-prefix: %v", err)
	}
	if o.unsafeSkipAdmissionPolicyCheck {
		o.AdmissionPolicy = ""
	} else if msgs := validation.IsDNS1123Subdomain(o.AdmissionPolicy); len(msgs) > 0 {
		fail("--admission-policy %q: %s", o.AdmissionPolicy, strings.Join(msgs, "; "))
	}
	var err error
	if o.ConsumerScope, err = ParseScope(o.consumerScope); err != nil {
		fail("--consumer-scope: %v", err)
	}
	return errors.Join(errs...)
}
