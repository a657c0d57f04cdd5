package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Where the Lease lives: flag, else POD_NAMESPACE, else the pod's
// namespace file; with none, leader election is off (a local run).
func TestLeaderElectionNamespace(t *testing.T) {
	nsFile := filepath.Join(t.TempDir(), "namespace")
	old := inClusterNamespaceFile
	inClusterNamespaceFile = nsFile
	t.Cleanup(func() { inClusterNamespaceFile = old })

	c := mustParse(t, nil, nil)
	if c.LeaderElection || c.LeaderElectionNamespace != "" || c.LeaderElectionLeaseName != "kube-bind-backend" {
		t.Errorf("no namespace known: election %v in %q, lease %q; want off", c.LeaderElection, c.LeaderElectionNamespace, c.LeaderElectionLeaseName)
	}
	if err := os.WriteFile(nsFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c := mustParse(t, nil, nil); !c.LeaderElection || c.LeaderElectionNamespace != "from-file" {
		t.Errorf("in a pod: election %v in %q, want on in from-file", c.LeaderElection, c.LeaderElectionNamespace)
	}
	if c := mustParse(t, nil, map[string]string{"POD_NAMESPACE": "from-env", "POD_NAME": "kbb-0"}); c.LeaderElectionNamespace != "from-env" || c.PodName != "kbb-0" {
		t.Errorf("POD_NAMESPACE: %q %q", c.LeaderElectionNamespace, c.PodName)
	}
	c = mustParse(t, []string{"--leader-election-namespace=flag-ns", "--leader-election-lease-name=my-lease"}, map[string]string{"POD_NAMESPACE": "from-env"})
	if c.LeaderElectionNamespace != "flag-ns" || c.LeaderElectionLeaseName != "my-lease" {
		t.Errorf("flags: %q %q", c.LeaderElectionNamespace, c.LeaderElectionLeaseName)
	}
	if c := mustParse(t, []string{"--leader-election=false"}, map[string]string{"POD_NAMESPACE": "from-env"}); c.LeaderElection {
		t.Error("--leader-election=false left it on")
	}
	for _, args := range [][]string{{"--leader-election-namespace=Not_A_Namespace"}, {"--leader-election-namespace=ns", "--leader-election-lease-name=bad name"}} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--leader-election") {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}
