// Package replicas runs several backend processes on loopback that share
// sessions through the hashring (docs/sessions-hashring.md): any replica
// answers any request, a dead replica's sessions end with 410 and nothing
// provisioned is lost, and a replica added later joins the ring. The
// provider cluster is a real control plane, the identity provider a real
// OpenID Connect provider.
package replicas

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kbprovider/backend/deploy/crds"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
)

// backendBinary is cmd/backend, built once for all tests.
var backendBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "replicas-backend-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	backendBinary = filepath.Join(dir, "kube-bind-backend")
	build := exec.Command("go", "build", "-o", backendBinary, "./cmd/backend")
	build.Dir = repoRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the backend:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := controlplane.RunMain(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

const (
	namespacePrefix = "kb-replicas-"
	exportedCRD     = "mangodbs.mangodb.com"
)

var (
	clusterOnce sync.Once
	clusterErr  error
)

// prepareCluster installs the kube-bind CRDs, the consumer ClusterRoles and
// one exported CRD.
func prepareCluster(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin := cp.AdminConfig()
		if clusterErr = crds.Install(ctx, admin); clusterErr != nil {
			return
		}
		if clusterErr = binding.InstallClusterRoles(ctx, admin); clusterErr != nil {
			return
		}
		ext := apiextensionsclient.NewForConfigOrDie(admin)
		preserve := true
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: exportedCRD, Labels: map[string]string{binding.ExportedLabel: "true"}},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "mangodb.com",
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "mangodbs", Kind: "MangoDB", ListKind: "MangoDBList", Singular: "mangodb"},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1alpha1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: &preserve,
					}},
				}},
			},
		}
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			clusterErr = err
			return
		}
		clusterErr = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	})
	if clusterErr != nil {
		t.Fatalf("preparing the control plane: %v", clusterErr)
	}
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
