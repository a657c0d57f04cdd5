package kbmanager

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// Where the Lease lives: flag, else POD_NAMESPACE, else the pod's
// namespace file; with none, leader election is off (a local run).
func TestLeaderOptionsNamespace(t *testing.T) {
	nsFile := filepath.Join(t.TempDir(), "namespace")
	old := inClusterNamespaceFile
	inClusterNamespaceFile = nsFile
	t.Cleanup(func() { inClusterNamespaceFile = old })
	complete := func(podNamespace, podName string, args ...string) (*LeaderOptions, error) {
		o := &LeaderOptions{PodNamespace: podNamespace, PodName: podName}
		if err := flagvalue.Parse(args, o.AddFlags); err != nil {
			t.Fatalf("parsing %q: %v", args, err)
		}
		return o, errors.Join(o.Complete()...)
	}

	if o, err := complete("", ""); err != nil || o.Enabled || o.Namespace != "" || o.LeaseName != "kube-bind-backend" {
		t.Errorf("no namespace known: %+v %v; want off", o, err)
	}
	if err := os.WriteFile(nsFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, _ := complete("", ""); !o.Enabled || o.Namespace != "from-file" {
		t.Errorf("in a pod: %+v, want on in from-file", o)
	}
	if o, _ := complete("from-env", "kbb-0"); o.Namespace != "from-env" || o.PodName != "kbb-0" {
		t.Errorf("POD_NAMESPACE: %+v", o)
	}
	if o, _ := complete("from-env", "", "--leader-election-namespace=flag-ns", "--leader-election-lease-name=my-lease"); o.Namespace != "flag-ns" || o.LeaseName != "my-lease" {
		t.Errorf("flags: %+v", o)
	}
	if o, _ := complete("from-env", "", "--leader-election=false"); o.Enabled {
		t.Error("--leader-election=false left it on")
	}
	for _, args := range [][]string{{"--leader-election-namespace=Not_A_Namespace"}, {"--leader-election-namespace=ns", "--leader-election-lease-name=bad name"}} {
		if _, err := complete("", "", args...); err == nil || !strings.Contains(err.Error(), "--leader-election") {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}
