package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

var sheriffAPI = exampleapis.API{Group: "sheriffs.example.com", Plural: "sheriffs", Kind: "Sheriff", Exported: true}

// TestV1alpha2ConsumerSide completes a kube-bind.io/v1alpha2
// BindingResponse in a fresh consumer cluster: the provider side is a
// real control plane with the provider CRDs, where the test does what the
// backend would (BoundSchema, APIServiceExport, the request's phase,
// APIServiceNamespaces), and the released konnector v0.8.2 runs as a
// process with a token of the ServiceAccount the bind made, so the RBAC it
// wrote is all the konnector has. An object then syncs both ways.
func TestV1alpha2ConsumerSide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	provider := controlplane.Get(t)
	cons := freshConsumer(t)
	if err := exampleapis.Prepare(ctx, provider, sheriffAPI); err != nil {
		t.Fatalf("preparing the provider cluster: %v", err)
	}
	ns, kubeconfig := providerNamespace(ctx, t, provider)
	go fakeBackend(ctx, t, provider, ns)

	req, _ := json.Marshal(v1alpha2.APIServiceExportRequestResponse{
		APIVersion: v1alpha2.GroupVersion, Kind: v1alpha2.KindAPIServiceExportRequest,
		Metadata: v1alpha2.NameMeta{Name: "sheriffs"},
		Spec: v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{{Group: sheriffAPI.Group, Resource: sheriffAPI.Plural, Versions: []string{exampleapis.Version}}},
			SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways},
	})
	binding := apply.Binding{
		Protocol: apply.ProtocolV1alpha2, ExportURL: "https://provider.example/export",
		Identity:   apply.Identity{ClusterID: "cid-v1alpha2"},
		Kubeconfig: kubeconfig, Server: provider.Host(), Namespace: ns,
		Requests: []json.RawMessage{req},
	}

	// The konnector runs as a process once the bind deployed it.
	consumerKube := kubernetes.NewForConfigOrDie(cons.AdminConfig())
	var k *konnector.Konnector
	var kmu sync.Mutex
	bindDone := make(chan struct{})
	go func() {
		token, err := konnector.TokenWhenDeployed(ctx, consumerKube, time.Hour, bindDone)
		if err != nil {
			t.Logf("no konnector: %v", err) // the bind's error says why
			return
		}
		kc := controlplane.KubeconfigFile(t, cons.ConfigForToken(token))
		kk, err := konnector.Run(konnector.Options{
			Binary:     konnector.ReleasedBinaryOf(t, konnector.ReleasedV1alpha2, "konnector"),
			Kubeconfig: kc, Servers: []string{provider.Host()},
		})
		if err != nil {
			t.Errorf("konnector: %v", err)
			return
		}
		kmu.Lock()
		k = kk
		kmu.Unlock()
	}()
	t.Cleanup(func() {
		kmu.Lock()
		defer kmu.Unlock()
		if k != nil {
			k.Stop()
			if t.Failed() {
				t.Logf("konnector log:\n%s", k.Log())
			}
		}
	})

	var progress bytes.Buffer
	binder, err := apply.New(apply.Options{Config: cons.AdminConfig(), WaitTimeout: 3 * time.Minute, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	out, err := binder.Bind(ctx, binding)
	close(bindDone)
	t.Logf("bind:\n%s", progress.String())
	if err != nil {
		t.Fatalf("Bind: %v", err)
	}

	// What the bind left, as the released v0.8 CLI leaves it.
	secret, err := consumerKube.CoreV1().Secrets(apply.Namespace).Get(ctx, out.SecretName, metav1.GetOptions{})
	if err != nil || secret.Labels[apply.LabelProviderKubeconfig] != "true" || !bytes.Equal(secret.Data[apply.KubeconfigKey], kubeconfig) {
		t.Errorf("kubeconfig Secret %s: %v %v", out.SecretName, err, secret.Labels)
	}
	consumerDyn := dynamic.NewForConfigOrDie(cons.AdminConfig())
	b, err := consumerDyn.Resource(apply.BindingV1alpha2GVR).Get(ctx, "sheriffs", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("APIServiceBinding sheriffs: %v", err)
	}
	if nested(b, "spec", "kubeconfigSecretRef", "name") != out.SecretName || nested(b, "spec", "kubeconfigSecretRef", "namespace") != apply.Namespace ||
		nested(b, "spec", "kubeconfigSecretRef", "key") != apply.KubeconfigKey {
		t.Errorf("APIServiceBinding points at %v", b.Object["spec"])
	}
	d, err := consumerKube.AppsV1().Deployments(apply.Namespace).Get(ctx, apply.KonnectorName, metav1.GetOptions{})
	if err != nil || d.Spec.Template.Spec.Containers[0].Image != apply.DefaultKonnectorV1alpha2 {
		t.Fatalf("konnector Deployment: %v", err)
	}
	r, err := dynamic.NewForConfigOrDie(provider.AdminConfig()).Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(ns).Get(ctx, "sheriffs", metav1.GetOptions{})
	if err != nil || nested(r, "status", "phase") != "Succeeded" {
		t.Errorf("the request on the provider: %v %v", err, r)
	}

	// The konnector makes the CRD and syncs both ways.
	crds := apiextensionsclient.NewForConfigOrDie(cons.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "the konnector to create the bound CRD", func() (bool, error) {
		crd, err := crds.Get(ctx, sheriffAPI.Name(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return len(crd.OwnerReferences) > 0 && crd.OwnerReferences[0].Name == "sheriffs", nil
	})
	konnector.SyncsBothWays(t, cons.AdminConfig(), provider.AdminConfig(), sheriffAPI, "s1", "")

	// A rerun finishes nothing new and keeps the rights, read back from
	// the binding's status.
	progress.Reset()
	if _, err := binder.Bind(ctx, binding); err != nil {
		t.Fatalf("rerun: %v\n%s", err, progress.String())
	}
	if !strings.Contains(progress.String(), "APIServiceBinding sheriffs: exists") || !strings.Contains(progress.String(), "kept "+apply.DefaultKonnectorV1alpha2) {
		t.Errorf("rerun:\n%s", progress.String())
	}
	cr, err := consumerKube.RbacV1().ClusterRoles().Get(ctx, apply.KonnectorRoleName, metav1.GetOptions{})
	if err != nil || !grants(cr.Rules, sheriffAPI.Group, sheriffAPI.Plural) {
		t.Errorf("ClusterRole after the rerun: %v %v", err, cr)
	}

	kmu.Lock()
	defer kmu.Unlock()
	if k == nil {
		t.Fatal("the konnector never started")
	}
	if log := k.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the konnector was refused something with the RBAC the bind wrote:\n%s", testutil.GrepLines(log, "orbidden"))
	}
	if done, err := k.Exited(); done {
		t.Errorf("the konnector exited: %v", err)
	}
}

func grants(rules []rbacv1.PolicyRule, group, resource string) bool {
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if g == group && res == resource {
					return true
				}
			}
		}
	}
	return false
}

// freshConsumer is a consumer cluster of this test alone: TestBind's
// cluster holds v1alpha1 bindings of a backend that is gone.
func freshConsumer(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting a consumer control plane: %v", err)
	}
	t.Cleanup(func() {
		cp.Stop()
		if !t.Failed() {
			_ = os.RemoveAll(cp.LogDir())
		}
	})
	return cp
}

// providerNamespace makes what a bind makes on the provider for the test:
// a namespace, a ServiceAccount whose token is the issued kubeconfig's,
// the ClusterBinding and the kubeconfig Secret. Its rights are wide: the
// provider's RBAC is the backend's business, tested with it.
func providerNamespace(ctx context.Context, t *testing.T, provider *controlplane.ControlPlane) (string, []byte) {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(provider.AdminConfig())
	ns := fmt.Sprintf("kb-v1alpha2-%d", time.Now().UnixNano()%1e6)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "consumer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "consumer", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seconds := int64(3600)
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "consumer",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["provider"] = &clientcmdapi.Cluster{Server: provider.Host(), CertificateAuthorityData: provider.CAData()}
	cfg.AuthInfos["consumer"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "provider", AuthInfo: "consumer", Namespace: ns}
	cfg.CurrentContext = "default"
	kubeconfig, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kubeconfig"},
		Data: map[string][]byte{"kubeconfig": kubeconfig}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(provider.AdminConfig())
	cb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha2.GroupVersion, "kind": "ClusterBinding",
		"metadata": map[string]any{"name": "cluster"},
		"spec": map[string]any{"providerPrettyName": "Test provider",
			"kubeconfigSecretRef": map[string]any{"name": "kubeconfig", "key": "kubeconfig"}},
	}}
	if _, err := dyn.Resource(kbresources.ClusterBindingsV1alpha2).Namespace(ns).Create(ctx, cb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns, kubeconfig
}

// fakeBackend decides requests and serves APIServiceNamespaces in ns as
// the backend does, until ctx ends.
func fakeBackend(ctx context.Context, t *testing.T, provider *controlplane.ControlPlane, ns string) {
	dyn := dynamic.NewForConfigOrDie(provider.AdminConfig())
	kube := kubernetes.NewForConfigOrDie(provider.AdminConfig())
	crds := apiextensionsclient.NewForConfigOrDie(provider.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	reqs := dyn.Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(ns)
	for ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		list, err := reqs.List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, r := range list.Items {
			if phase := nested(&r, "status", "phase"); phase != "" && phase != "Pending" {
				continue
			}
			var spec v1alpha2.APIServiceExportRequestSpec
			b, _ := json.Marshal(r.Object["spec"])
			_ = json.Unmarshal(b, &spec)
			for _, res := range spec.Resources {
				crd, err := crds.Get(ctx, res.Name(), metav1.GetOptions{})
				if err != nil {
					t.Errorf("fake backend: CRD %s: %v", res.Name(), err)
					continue
				}
				var versions []any
				for _, v := range crd.Spec.Versions {
					versions = append(versions, map[string]any{"name": v.Name, "served": v.Served, "storage": v.Storage,
						"schema": toMap(v.Schema), "subresources": toMap(v.Subresources)})
				}
				bs := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": v1alpha2.GroupVersion, "kind": v1alpha2.KindBoundSchema,
					"metadata": map[string]any{"name": res.Name()},
					"spec": map[string]any{"informerScope": "Namespaced", "group": crd.Spec.Group, "names": toMap(crd.Spec.Names),
						"scope": string(crd.Spec.Scope), "versions": versions},
				}}
				if _, err := dyn.Resource(kbresources.BoundSchemas).Namespace(ns).Create(ctx, bs, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Errorf("fake backend: BoundSchema: %v", err)
				}
			}
			export := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha2.GroupVersion, "kind": v1alpha2.KindAPIServiceExport,
				"metadata": map[string]any{"name": r.GetName()},
				"spec":     map[string]any{"resources": toAny(spec.Resources), "informerScope": "Namespaced", "isolation": v1alpha2.IsolationPrefixed},
			}}
			if _, err := dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Create(ctx, export, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("fake backend: APIServiceExport: %v", err)
			}
			_ = unstructured.SetNestedField(r.Object, "Succeeded", "status", "phase")
			if _, err := reqs.UpdateStatus(ctx, &r, metav1.UpdateOptions{}); err != nil {
				t.Logf("fake backend: request status: %v", err)
			}
		}
		sns, err := dyn.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, sn := range sns.Items {
			if nested(&sn, "status", "namespace") != "" {
				continue
			}
			target := ns + "-" + sn.GetName()
			if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: target}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Logf("fake backend: namespace: %v", err)
				continue
			}
			_ = unstructured.SetNestedField(sn.Object, target, "status", "namespace")
			if _, err := dyn.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(ns).UpdateStatus(ctx, &sn, metav1.UpdateOptions{}); err != nil {
				t.Logf("fake backend: APIServiceNamespace status: %v", err)
			}
		}
	}
}

func toMap(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func toAny(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

var (
	rangerAPI  = exampleapis.API{Group: "rangers.example.com", Plural: "rangers", Kind: "Ranger", Exported: true}
	marshalAPI = exampleapis.API{Group: "marshals.example.com", Plural: "marshals", Kind: "Marshal", Exported: true}
)

// TestBindV1alpha2EndToEnd binds with the command against the backend:
// auto discovery picks kube-bind.io/v1alpha2 at /api/exports, the poll
// flow runs through chromium and the OpenID Connect provider, the command
// completes the bind in a fresh consumer cluster with konnector v0.8.2
// (run as a process with the token of the ServiceAccount it made), and an
// object syncs both ways.
func TestBindV1alpha2EndToEnd(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, e.provider, rangerAPI, marshalAPI); err != nil {
		t.Fatal(err)
	}
	e2 := *e
	e2.consumer = freshConsumer(t)
	c := runCLI(t, t.TempDir(), cliBinary, []string{"--kubeconfig", e2.consumer.AdminKubeconfigPath(), "--wait-timeout", "3m", e.baseURL + "/export"})
	u := c.URL(t)
	bindInBrowser(t, &e2, u, rangerAPI.Name())

	consumerKube := kubernetes.NewForConfigOrDie(e2.consumer.AdminConfig())
	token, err := konnector.TokenWhenDeployed(ctx, consumerKube, time.Hour, c.Exited())
	if err != nil {
		t.Fatalf("%v\n%s", err, c.Stderr.String())
	}
	k := konnector.Start(t, konnector.Options{
		Binary:     konnector.ReleasedBinaryOf(t, konnector.ReleasedV1alpha2, "konnector"),
		Kubeconfig: controlplane.KubeconfigFile(t, e2.consumer.ConfigForToken(token)),
		Servers:    []string{e.provider.Host()},
	})
	if code := c.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, c.Stderr.String())
	}
	t.Logf("command output:\n%s", c.Stderr.String())
	if !strings.Contains(c.Stderr.String(), "(poll flow, "+v1alpha2.GroupVersion+")") {
		t.Errorf("the command did not bind through %s:\n%s", v1alpha2.GroupVersion, c.Stderr.String())
	}
	consumerDyn := dynamic.NewForConfigOrDie(e2.consumer.AdminConfig())
	if _, err := consumerDyn.Resource(apply.BindingV1alpha2GVR).Get(ctx, rangerAPI.Name(), metav1.GetOptions{}); err != nil {
		t.Fatalf("APIServiceBinding %s: %v", rangerAPI.Name(), err)
	}
	konnector.SyncsBothWays(t, e2.consumer.AdminConfig(), e.provider.AdminConfig(), rangerAPI, "s1", namespacePrefix)
	if log := k.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the konnector was refused something with the RBAC the command wrote:\n%s", testutil.GrepLines(log, "orbidden"))
	}

	// A rebind from another machine (a HOME of its own) finds the cluster
	// identity kept in the cluster and lands in the same provider
	// namespace.
	again := runCLI(t, t.TempDir(), cliBinary, []string{"--kubeconfig", e2.consumer.AdminKubeconfigPath(), "--wait-timeout", "3m", e.baseURL + "/export"})
	bindInBrowser(t, &e2, again.URL(t), rangerAPI.Name())
	if code := again.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("rebind: exit code %d:\n%s", code, again.Stderr.String())
	}
	if first, second := providerNamespaceOf(t, c), providerNamespaceOf(t, again); first != second {
		t.Errorf("the rebind landed in provider namespace %s, the first bind in %s", second, first)
	}

	// The released CLI binds another API into the same cluster, with the
	// konnector image named (docs/client.md: then it applies its own
	// konnector RBAC over ours); the konnector, still running as the same
	// ServiceAccount, serves both bindings.
	home := t.TempDir()
	chromium.LoginCLI(t, konnector.ReleasedV1alpha2, home, e.baseURL, alice)
	released := konnector.RunCLI(t, konnector.ReleasedV1alpha2, home, "apiservice", "--template-name", marshalAPI.Name(),
		"--name", marshalAPI.Name(), "--kubeconfig", e2.consumer.AdminKubeconfigPath(), "--konnector-image", apply.DefaultKonnectorV1alpha2)
	if code := released.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("kubectl-bind apiservice: exit %d", code)
	}
	konnector.SyncsBothWays(t, e2.consumer.AdminConfig(), e.provider.AdminConfig(), marshalAPI, "m1", namespacePrefix)
	konnector.SyncsBothWays(t, e2.consumer.AdminConfig(), e.provider.AdminConfig(), rangerAPI, "s2", namespacePrefix)
	if log := k.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the konnector was refused something after the released CLI's bind:\n%s", testutil.GrepLines(log, "orbidden"))
	}
}
