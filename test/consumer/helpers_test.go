package consumer

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	"github.com/kbprovider/backend/pkg/protocol"
)

// runCLI starts bin with args and a HOME of its own (a "machine" with no
// local state), with kube-bind-poll on the PATH; env adds variables.
func runCLI(t *testing.T, home string, bin string, args []string, env ...string) *procs.Command {
	t.Helper()
	return procs.Start(t, home, bin, args,
		append([]string{"HOME=" + home, "KUBECONFIG=", "PATH=" + cliDir + ":" + os.Getenv("PATH")}, env...)...)
}

// bindInBrowser opens u, signs alice in and binds the given APIs; it
// returns when the Bind button's page loaded, and the moment it was pressed.
func bindInBrowser(t *testing.T, e *env, u string, apis ...string) time.Time {
	t.Helper()
	return bindInBrowserThen(t, e, u, nil, apis...)
}

// bindInBrowserThen is bindInBrowser calling beforeBind (if set) just
// before it presses Bind.
func bindInBrowserThen(t *testing.T, e *env, u string, beforeBind func(), apis ...string) time.Time {
	t.Helper()
	b := chromium.OpenBindPage(t, u, e.baseURL+"/bind", alice)
	for _, a := range apis {
		b.Click("input[value='" + a + "']")
	}
	// The poll flow's page shows the code the command printed next to the
	// URL (derived from the session ID in it); the user confirms it.
	if pu, err := url.Parse(u); err == nil && pu.Query().Get("h") != "" {
		if code, want := b.Text("#confirmation-code"), protocol.ConfirmationCode(pu.Query().Get("s")); code != want {
			t.Errorf("the page shows confirmation code %q, want %q", code, want)
		}
	}
	b.Click("#confirm")
	if beforeBind != nil {
		beforeBind()
	}
	pressed := time.Now()
	b.ClickAndWait("button[value=bind]")
	return pressed
}

// startKonnectorWhenReady waits until the command deployed the konnector
// in the consumer cluster (pods never run there: no nodes), then runs the
// released konnector with a token of it: the RBAC the command wrote is all
// it gets.
func startKonnectorWhenReady(t *testing.T, e *env, c *procs.Command) *konnector.Konnector {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(e.consumer.AdminConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	token, err := konnector.TokenWhenDeployed(ctx, kube, time.Hour, c.Exited())
	if err != nil {
		t.Fatalf("%v; command running: %v\n%s", err, c.Running(), c.Stderr.String())
	}
	kc := controlplane.KubeconfigFile(t, e.consumer.ConfigForToken(token))
	return konnector.Start(t, konnector.Options{
		Kubeconfig: kc,
		Servers:    []string{e.provider.Host()},
		// A lease of its own per test: a stopped konnector's lease would
		// make the next one wait for it to expire.
		Args: []string{"--lease-name", "konnector-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))},
	})
}

var (
	bindingGVR = apply.BindingGVR
	requestGVR = apply.RequestGVR
	bindingNS  = kbresources.APIServiceNamespaces
	clusterGVR = kbresources.ClusterBindings
)

// kubeconfigSecrets lists the Secrets in kube-bind that hold a kubeconfig.
func kubeconfigSecrets(t *testing.T, kube kubernetes.Interface) []string {
	t.Helper()
	list, err := kube.CoreV1().Secrets(apply.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		if _, ok := s.Data[apply.KubeconfigKey]; ok {
			names = append(names, s.Name)
		}
	}
	return names
}

func nested(u *unstructured.Unstructured, fields ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, fields...)
	return s
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFileT(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}
