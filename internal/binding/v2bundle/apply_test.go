package v2bundle

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/konnector"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// kubectlApply pipes in to `kubectl apply --validate=strict -f -`, as a
// consumer does with a picked-up bundle.
func kubectlApply(t *testing.T, cp *controlplane.ControlPlane, in []byte) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(cp.BinDir(), "kubectl"), "--kubeconfig", cp.AdminKubeconfigPath(),
		"apply", "--validate=strict", "-f", "-")
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	return string(out)
}

// The released v2 CRDs accept both renderings in one apply on an empty
// cluster (strict validation: no field the CRDs do not know), and a
// second apply changes nothing.
func TestBundleAppliesToTheReleasedCRDs(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	if err := konnector.InstallV2CRDs(ctx, cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	b, err := Build(testInput)
	if err != nil {
		t.Fatal(err)
	}
	y, _ := b.YAML()
	out := kubectlApply(t, cp, y)
	for _, want := range []string{
		"namespace/kube-bind-abc123 created",
		"secret/kube-bind-kubeconfig created",
		"connection.core.kbind.io/kube-bind-abc123 created",
		"binding.core.kbind.io/mangodbs.mangodb.com created",
		"binding.core.kbind.io/widgets.example.com created",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl apply said:\n%s\nwithout %q", out, want)
		}
	}
	j, _ := b.JSON()
	if out := kubectlApply(t, cp, j); strings.Contains(out, "created") || strings.Contains(out, "configured") {
		t.Errorf("the JSON list applied over the YAML changed something:\n%s", out)
	}

	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())
	conn, err := dyn.Resource(schema.GroupVersionResource{Group: "core.kbind.io", Version: "v1alpha1", Resource: "connections"}).
		Get(ctx, "kube-bind-abc123", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if policy, _, _ := unstructured.NestedString(conn.Object, "spec", "schema", "pullPolicy"); policy != "Bound" {
		t.Errorf("Connection pullPolicy %q", policy)
	}
	bnd, err := dyn.Resource(schema.GroupVersionResource{Group: "core.kbind.io", Version: "v1alpha1", Resource: "bindings"}).
		Namespace("kube-bind-abc123").Get(ctx, "widgets.example.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if policy, _, _ := unstructured.NestedString(bnd.Object, "spec", "conflictPolicy"); policy != "Fail" {
		t.Errorf("Binding conflictPolicy %q", policy)
	}
}
