package binding

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestOptions(t *testing.T) {
	o, err := flagvalue.ParseNew[Options]()
	if err != nil || o.NamespacePrefix != "kube-bind-" || o.ConsumerScope != ScopeNamespaced || o.Quota != DefaultQuota() ||
		o.AdmissionPolicy != "kube-bind-backend-scope" || o.ExternalCA != nil || o.MaxClustersPerUser != DefaultMaxClustersPerUser {
		t.Errorf("defaults: %+v %v", o, err)
	}
	if o, err := flagvalue.ParseNew[Options]("--unsafe-skip-admission-policy-check", "--admission-policy=Not A Name", "--consumer-scope=cluster",
		"--consumer-max-namespaces=3", "--max-clusters-per-user=2"); err != nil || o.AdmissionPolicy != "" || o.ConsumerScope != ScopeCluster || o.Quota.Namespaces != 3 ||
		o.MaxClustersPerUser != 2 {
		t.Errorf("set: %+v %v", o, err)
	}

	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--external-ca-file", notPEM}, "no PEM certificate"},
		{[]string{"--external-ca-file", filepath.Join(dir, "missing")}, "--external-ca-file"},
		{[]string{"--external-address", "api.example.com:6443"}, "--external-address"},
		{[]string{"--consumer-scope", "Everything"}, "want Namespaced or Cluster"},
		{[]string{"--namespace-prefix", "Kube_"}, "--namespace-prefix"},
		{[]string{"--admission-policy", "Not A Name"}, "--admission-policy"},
		{[]string{"--consumer-max-export-requests", "0"}, "--consumer-max-export-requests 0"},
		{[]string{"--max-clusters-per-user", "0"}, "--max-clusters-per-user"},
		{[]string{"--max-clusters-per-user", "10001"}, "--max-clusters-per-user"},
	} {
		if _, err := flagvalue.ParseNew[Options](c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
