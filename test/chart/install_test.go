package chart_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
)

const (
	releaseNS = "kbb-install"
	saUser    = "system:serviceaccount:" + releaseNS + ":" + fullname
)

// canI asks the API server, through kubectl auth can-i impersonating the
// chart's ServiceAccount, whether it may do verb on resource.
func canI(t *testing.T, cp *controlplane.ControlPlane, namespace, verb, resource string, extra ...string) bool {
	t.Helper()
	args := []string{"--kubeconfig", cp.AdminKubeconfigPath(), "auth", "can-i", verb, resource, "--as", saUser}
	if namespace == "" {
		args = append(args, "--all-namespaces")
	} else {
		args = append(args, "-n", namespace)
	}
	args = append(args, extra...)
	out, err := exec.Command(testBinary(t, "kubectl"), args...).CombinedOutput()
	answer := strings.TrimSpace(string(out))
	switch {
	case err == nil && answer == "yes":
		return true
	case answer == "no" || strings.HasPrefix(answer, "no\n") || strings.HasPrefix(answer, "no -"):
		return false
	default:
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
		return false
	}
}

type request struct {
	namespace, verb, resource string
	extra                     []string
}

func (r request) String() string {
	ns := r.namespace
	if ns == "" {
		ns = "(cluster)"
	}
	return strings.TrimSpace(r.verb + " " + r.resource + " " + strings.Join(r.extra, " ") + " in " + ns)
}

func checkRequests(t *testing.T, cp *controlplane.ControlPlane, want bool, reqs []request) {
	t.Helper()
	for _, r := range reqs {
		if got := canI(t, cp, r.namespace, r.verb, r.resource, r.extra...); got != want {
			t.Errorf("can-i %s as the chart's ServiceAccount: %v, want %v", r, got, want)
		}
	}
}

func TestInstallGrantsExactlyWhatTheBackendDoes(t *testing.T) {
	cp := controlplane.Get(t)
	kubeconfig := cp.AdminKubeconfigPath()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(cp.AdminConfig())

	install := append([]string{"upgrade", "--install", "kbb", chartDir(t), "--kubeconfig", kubeconfig,
		"--namespace", releaseNS, "--create-namespace"}, setArgs(requiredValues())...)
	start := time.Now()
	out, err := helm(t, install...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install took %v", time.Since(start).Round(time.Millisecond))
	// Consumers' quotas count objects of the CRDs the chart installed.
	if err := exampleapis.AwaitQuotaCounting(ctx, cp); err != nil {
		t.Fatal(err)
	}
	// The notes give the export URL and the redirect URL to register.
	for _, want := range []string{"kubectl bind https://bind.example.com/export", "https://bind.example.com/callback"} {
		if !strings.Contains(out, want) {
			t.Errorf("install notes lack %q:\n%s", want, out)
		}
	}

	// What the release made is there.
	if _, err := admin.AppsV1().Deployments(releaseNS).Get(ctx, fullname, metav1.GetOptions{}); err != nil {
		t.Fatalf("Deployment: %v", err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(releaseNS).Get(ctx, fullname, metav1.GetOptions{}); err != nil {
		t.Fatalf("ServiceAccount: %v", err)
	}
	secret, err := admin.CoreV1().Secrets(releaseNS).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Secret: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, name := range []string{"clusterbindings.kube-bind.io", "apiserviceexports.kube-bind.io", "apiserviceexportrequests.kube-bind.io", "apiservicenamespaces.kube-bind.io"} {
		if _, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("CRD %s not installed: %v", name, err)
		}
	}

	deployment, err := admin.AppsV1().Deployments(releaseNS).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := deployment.Spec.Template.Annotations["checksum/secret"]
	// An upgrade with the same values changes nothing: the generated keys
	// are looked up, not made again, so the pods do not restart.
	if _, err := helm(t, install...); err != nil {
		t.Fatal(err)
	}
	if d, _ := admin.AppsV1().Deployments(releaseNS).Get(ctx, fullname, metav1.GetOptions{}); d.Spec.Template.Annotations["checksum/secret"] != before {
		t.Error("an upgrade with unchanged values changed the pod template's secret checksum (pods would restart)")
	}
	// An upgrade keeps the generated keys (lookup) and takes a new client secret.
	upgrade := append(append([]string{}, install...), "--set", "oidc.clientSecret=rotated")
	if _, err := helm(t, upgrade...); err != nil {
		t.Fatal(err)
	}
	// ... and the pods restart for the new client secret (a changed checksum).
	checksum := func() string {
		d, err := admin.AppsV1().Deployments(releaseNS).Get(ctx, fullname, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Annotations["checksum/secret"]
	}
	after, err := admin.CoreV1().Secrets(releaseNS).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cookie-signing-key", "cookie-encryption-key", "peer-key"} {
		if len(secret.Data[k]) == 0 || string(after.Data[k]) != string(secret.Data[k]) {
			t.Errorf("helm upgrade changed the generated %s", k)
		}
	}
	if before == "" || checksum() == before {
		t.Error("a new client secret did not change the pod template's secret checksum: pods would keep the old one")
	}
	if string(after.Data["oidc-client-secret"]) != "rotated" {
		t.Errorf("oidc-client-secret after upgrade = %q, want rotated", after.Data["oidc-client-secret"])
	}

	// Every request the backend makes outside consumer namespaces.
	checkRequests(t, cp, true, []request{
		{"", "get", "customresourcedefinitions.apiextensions.k8s.io", nil},
		{"", "list", "customresourcedefinitions.apiextensions.k8s.io", nil},
		{"", "watch", "customresourcedefinitions.apiextensions.k8s.io", nil},
		{"", "get", "namespaces", nil},
		{"", "list", "namespaces", nil},
		{"", "watch", "namespaces", nil},
		{"", "create", "namespaces", nil},
		{"", "delete", "namespaces", nil},
		// The controllers' caches (internal/binding/controllers/exportrequests).
		{"", "list", "apiserviceexportrequests.kube-bind.io", nil},
		{"", "watch", "apiserviceexportrequests.kube-bind.io", nil},
		{"", "list", "apiserviceexports.kube-bind.io", nil},
		{"", "watch", "apiserviceexports.kube-bind.io", nil},
		{"", "list", "apiservicenamespaces.kube-bind.io", nil},
		{"", "watch", "apiservicenamespaces.kube-bind.io", nil},
		// The credentials controller's cache (internal/binding/controllers/credentials).
		{"", "list", "clusterbindings.kube-bind.io", nil},
		{"", "watch", "clusterbindings.kube-bind.io", nil},
		// Leader election: its own Lease.
		{releaseNS, "create", "leases.coordination.k8s.io", nil},
		{releaseNS, "get", "leases.coordination.k8s.io/" + fullname, nil},
		{releaseNS, "update", "leases.coordination.k8s.io/" + fullname, nil},
		{"kube-bind-newconsumer", "create", "rolebindings.rbac.authorization.k8s.io", nil},
		{"", "bind", "clusterroles.rbac.authorization.k8s.io/kube-bind-consumer", nil},
		{"", "bind", "clusterroles.rbac.authorization.k8s.io/kube-bind-backend-namespace", nil},
		{"", "create", "selfsubjectreviews.authentication.k8s.io", nil},
		{releaseNS, "list", "endpointslices.discovery.k8s.io", nil},
		{releaseNS, "watch", "endpointslices.discovery.k8s.io", nil},
		// The session records: Secrets of its own namespace.
		{releaseNS, "get", "secrets", nil},
		{releaseNS, "list", "secrets", nil},
		{releaseNS, "watch", "secrets", nil},
		{releaseNS, "create", "secrets", nil},
		{releaseNS, "delete", "secrets", nil},
		{releaseNS, "deletecollection", "secrets", nil},
		// The heartbeat controller's cache of the v2 konnectors' Leases.
		{"kbind", "list", "leases.coordination.k8s.io", nil},
		{"kbind", "watch", "leases.coordination.k8s.io", nil},
		// The per-user CLI token revocations: one ConfigMap, read only.
		{releaseNS, "get", "configmaps/" + fullname + "-cli-token-revocations", nil},
		{releaseNS, "list", "configmaps/" + fullname + "-cli-token-revocations", nil},
		{releaseNS, "watch", "configmaps/" + fullname + "-cli-token-revocations", nil},
	})
	// A sample of what it must never be able to do.
	checkRequests(t, cp, false, []request{
		{"", "*", "*", nil},
		{"kube-system", "get", "secrets", nil},
		{"", "list", "secrets", nil},
		{"", "watch", "secrets", nil},
		{releaseNS, "update", "secrets", nil},
		{"", "delete", "customresourcedefinitions.apiextensions.k8s.io", nil},
		{"", "update", "customresourcedefinitions.apiextensions.k8s.io", nil},
		{"", "update", "namespaces", nil},
		{"", "patch", "namespaces", nil},
		{releaseNS, "update", "leases.coordination.k8s.io/kube-controller-manager", nil},
		{"kube-system", "create", "leases.coordination.k8s.io", nil},
		// (update and create in kbind it holds as every service account
		// does, for v2 konnectors; the admission policy refuses them to
		// whoever is no consumer: test/v2.)
		{"kbind", "delete", "leases.coordination.k8s.io", nil},
		{"", "list", "leases.coordination.k8s.io", nil},
		{"", "create", "apiserviceexports.kube-bind.io", nil},
		{"", "patch", "apiserviceexportrequests.kube-bind.io", nil},
		{"default", "create", "roles.rbac.authorization.k8s.io", nil},
		{"default", "escalate", "roles.rbac.authorization.k8s.io", nil},
		{"", "create", "clusterrolebindings.rbac.authorization.k8s.io", nil},
		{"", "bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin", nil},
		{"", "escalate", "clusterroles.rbac.authorization.k8s.io", nil},
		{"", "update", "clusterroles.rbac.authorization.k8s.io", nil},
		{"kube-system", "create", "serviceaccounts", nil},
		{"kube-system", "create", "pods", nil},
		{"default", "get", "rolebindings.rbac.authorization.k8s.io", nil},
		{"default", "list", "endpointslices.discovery.k8s.io", nil},
		{"", "impersonate", "users", nil},
		{"", "create", "serviceaccounts/token", nil},
		{releaseNS, "get", "configmaps/another", nil},
		{releaseNS, "update", "configmaps/" + fullname + "-cli-token-revocations", nil},
	})

	t.Run("consumer namespace, as the service account's own token", func(t *testing.T) {
		testConsumerNamespace(t, cp, admin)
	})

	t.Run("consumer Roles within what a provider declares", func(t *testing.T) {
		testConsumerRolesWithinDeclared(t, cp, admin)
	})

	t.Run("escalation attempts without the admission policy", func(t *testing.T) {
		testEscalationWithoutPolicy(t, cp, admin)
	})

	t.Run("backend binary with the chart's flags, keys and ServiceAccount, memory store", func(t *testing.T) {
		testBackendRunsWithChartConfig(t, cp, admin, memoryMode)
	})
	t.Run("backend binary with the chart's flags, keys and ServiceAccount, ring store", func(t *testing.T) {
		testBackendRunsWithChartConfig(t, cp, admin, ringMode)
	})
	t.Run("backend binary with the chart's flags, keys and ServiceAccount, TLS from a mounted Secret", func(t *testing.T) {
		testBackendRunsWithChartConfig(t, cp, admin, tlsMode)
	})

	if _, err := helm(t, "uninstall", "kbb", "--kubeconfig", kubeconfig, "--namespace", releaseNS, "--wait"); err != nil {
		t.Fatal(err)
	}
	// ctx was for the install: the subtests took their own time since (over
	// its 2 minutes on a loaded machine), so the check after the uninstall
	// gets a deadline of its own.
	uninstalled, cancelUninstalled := context.WithTimeout(context.Background(), time.Minute)
	defer cancelUninstalled()
	if _, err := admin.RbacV1().ClusterRoles().Get(uninstalled, "kube-bind-backend", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole kube-bind-backend after uninstall: %v, want NotFound", err)
	}
}

// testConsumerNamespace runs the backend's own provisioning code
// (internal/binding: catalog informer, Provision, Unbind) with a real token
// of the chart's ServiceAccount, so every request it makes is checked
// against the chart's RBAC and admission policy; then it probes the rights
// the backend ends up with inside and outside the consumer namespace.
func testConsumerNamespace(t *testing.T, cp *controlplane.ControlPlane, admin kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	asSA := backendSAConfig(ctx, t, cp, admin)
	as := kubernetes.NewForConfigOrDie(asSA)

	// An exported API for the consumer to bind.
	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "mangodbs.example.com", "labels": map[string]any{binding.ExportedLabel: "true"}},
		"spec": map[string]any{
			"group": "example.com", "scope": "Namespaced",
			"names": map[string]any{"plural": "mangodbs", "singular": "mangodb", "kind": "MangoDB", "listKind": "MangoDBList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	catalog, err := binding.NewCatalog(asSA, binding.Scope("Namespaced"))
	if err != nil {
		t.Fatal(err)
	}
	catalog.Start(ctx)
	if !catalog.WaitForSync(ctx) {
		t.Fatal("the catalog informer cannot list/watch CRDs with the chart's ServiceAccount")
	}
	for {
		if _, ok := catalog.Lookup("example.com", "mangodbs"); ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the exported CRD never appeared in the catalog")
		}
		time.Sleep(50 * time.Millisecond)
	}

	p, err := binding.NewProvisioner(asSA, catalog, binding.Config{NamespacePrefix: "kube-bind-", ProviderPrettyName: "chart test"})
	if err != nil {
		t.Fatal(err)
	}
	alice := binding.Consumer{Issuer: "https://login.example.com", Subject: "alice"}
	var kubeconfig []byte
	for i := 0; i < 2; i++ { // new consumer, then returning consumer
		start := time.Now()
		resp, err := p.Provision(ctx, alice, "cluster1", []binding.Resource{{Group: "example.com", Resource: "mangodbs"}})
		if err != nil {
			t.Fatalf("Provision #%d with the chart's ServiceAccount: %v", i+1, err)
		}
		if len(resp.Kubeconfig) == 0 || len(resp.APIs) != 1 {
			t.Fatalf("Provision #%d: kubeconfig %d bytes, %d APIs", i+1, len(resp.Kubeconfig), len(resp.APIs))
		}
		t.Logf("Provision #%d as the chart's ServiceAccount: %v", i+1, time.Since(start).Round(time.Millisecond))
		kubeconfig = resp.Kubeconfig
	}
	ns := p.Namespace(alice, "cluster1")
	runControllersAsChartAccount(t, ctx, asSA, catalog, p, kubeconfig, ns)

	// Inside the consumer namespace: exactly the namespace role.
	checkRequests(t, cp, true, []request{
		{ns, "get", "serviceaccounts", nil}, {ns, "patch", "serviceaccounts", nil}, {ns, "delete", "serviceaccounts", nil},
		{ns, "get", "secrets", nil}, {ns, "patch", "secrets", nil}, {ns, "delete", "secrets", nil},
		{ns, "get", "rolebindings.rbac.authorization.k8s.io", nil}, {ns, "patch", "rolebindings.rbac.authorization.k8s.io", nil},
		{ns, "get", "clusterbindings.kube-bind.io", nil}, {ns, "patch", "clusterbindings.kube-bind.io", nil},
		// The controllers (internal/binding/controllers/exportrequests).
		{ns, "patch", "apiserviceexportrequests.kube-bind.io", []string{"--subresource=status"}},
		{ns, "patch", "apiservicenamespaces.kube-bind.io", []string{"--subresource=status"}},
		{ns, "create", "apiserviceexports.kube-bind.io", nil}, {ns, "patch", "apiserviceexports.kube-bind.io", nil},
		{ns, "delete", "apiserviceexports.kube-bind.io", nil},
		{ns, "create", "roles.rbac.authorization.k8s.io", nil}, {ns, "patch", "roles.rbac.authorization.k8s.io", nil},
		{ns, "escalate", "roles.rbac.authorization.k8s.io/" + binding.ConsumerExportsRole, nil},
		{ns, "bind", "roles.rbac.authorization.k8s.io/" + binding.ConsumerClaimsRole, nil},
		// Consumer credentials (internal/binding tokens, internal/binding/controllers/credentials).
		{ns, "list", "secrets", nil},
		{ns, "create", "serviceaccounts/token", nil},
		{ns, "patch", "clusterbindings.kube-bind.io", []string{"--subresource=status"}},
	})
	checkRequests(t, cp, false, []request{
		{ns, "watch", "secrets", nil},
		{ns, "create", "pods", nil},
		{ns, "delete", "rolebindings.rbac.authorization.k8s.io", nil},
		{ns, "delete", "roles.rbac.authorization.k8s.io", nil},
		{ns, "escalate", "roles.rbac.authorization.k8s.io", nil},
		{ns, "bind", "roles.rbac.authorization.k8s.io/admin", nil},
		{ns, "patch", "apiserviceexportrequests.kube-bind.io", nil},
		{ns, "delete", "apiserviceexportrequests.kube-bind.io", nil},
		{"default", "create", "serviceaccounts", nil},
		{"kube-system", "get", "secrets", nil},
	})

	// RBAC escalation check: no other role can be granted, even there.
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "escalate"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: saUser, APIGroup: "rbac.authorization.k8s.io"}},
	}
	if _, err := as.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("binding cluster-admin in a consumer namespace: %v, want Forbidden", err)
	}

	// The admission policy: the grants RBAC allows cluster-wide are refused
	// outside the namespaces the backend made.
	victim := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-bind-victim"}} // right prefix, not made by the backend
	if _, err := admin.CoreV1().Namespaces().Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb = &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "steal"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: binding.BackendNamespaceClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: saUser, APIGroup: "rbac.authorization.k8s.io"}},
	}
	// The policy takes effect shortly after install: wait for it with a dry run.
	for {
		_, err := as.RbacV1().RoleBindings("kube-system").Create(ctx, rb, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the admission policy never refused a self-grant in kube-system: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, target := range []string{"kube-system", victim.Name} {
		_, err := as.RbacV1().RoleBindings(target).Create(ctx, rb, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may only create rolebindings in namespaces it made") {
			t.Errorf("the backend granting itself %s in %s: %v, want Forbidden by the chart's admission policy",
				binding.BackendNamespaceClusterRole, target, err)
		}
	}
	err = as.CoreV1().Namespaces().Delete(ctx, victim.Name, metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may only delete namespaces it made") {
		t.Errorf("the backend deleting a namespace it did not make: %v, want Forbidden by the chart's admission policy", err)
	}
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "not-kube-bind", Labels: map[string]string{binding.LabelManagedBy: "kube-bind-backend"}}}
	if _, err := as.CoreV1().Namespaces().Create(ctx, other, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the backend creating a namespace outside its prefix: %v, want Forbidden", err)
	}

	// Unbind, with the same account.
	if err := p.Unbind(ctx, alice, "cluster1"); err != nil {
		t.Fatalf("Unbind with the chart's ServiceAccount: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// runControllersAsChartAccount runs the provider-side controllers
// (internal/binding/controllers/exportrequests) with the chart's ServiceAccount, under the chart's
// admission policy: a request created with the issued kubeconfig succeeds,
// and an APIServiceNamespace gets its namespace.
func runControllersAsChartAccount(t *testing.T, ctx context.Context, asSA *rest.Config, catalog *binding.Catalog, p *binding.Provisioner, kubeconfig []byte, ns string) {
	t.Helper()
	ctrl, err := exportrequests.New(exportrequests.Config{Catalog: catalog, GrantBackend: p.GrantBackend, NamespacePrefix: "kube-bind-"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { kbmanager.Run(runCtx, asSA, kbmanager.Options{}, ctrl.Setup); done <- nil }()
	defer func() { stop(); <-done }()

	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	consumer := dynamic.NewForConfigOrDie(rc)
	kb := func(resource string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha1", Resource: resource}
	}
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": "mangodbs.example.com"},
		"spec":     map[string]any{"resources": []any{map[string]any{"group": "example.com", "resource": "mangodbs"}}},
	}}
	apiNS := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceNamespace", "metadata": map[string]any{"name": "default"},
	}}
	for gvr, obj := range map[schema.GroupVersionResource]*unstructured.Unstructured{kb("apiserviceexportrequests"): req, kb("apiservicenamespaces"): apiNS} {
		if _, err := consumer.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s with the issued kubeconfig: %v", gvr.Resource, err)
		}
	}
	start := time.Now()
	for {
		r, _ := consumer.Resource(kb("apiserviceexportrequests")).Namespace(ns).Get(ctx, "mangodbs.example.com", metav1.GetOptions{})
		a, _ := consumer.Resource(kb("apiservicenamespaces")).Namespace(ns).Get(ctx, "default", metav1.GetOptions{})
		var phase, child string
		if r != nil {
			phase, _, _ = unstructured.NestedString(r.Object, "status", "phase")
		}
		if a != nil {
			child, _, _ = unstructured.NestedString(a.Object, "status", "namespace")
		}
		if phase == "Succeeded" && child != "" {
			t.Logf("controllers as the chart's ServiceAccount: request Succeeded and APIServiceNamespace -> %s in %v", child, time.Since(start).Round(time.Millisecond))
			break
		}
		if phase == "Failed" || ctx.Err() != nil || time.Since(start) > 30*time.Second {
			t.Fatalf("with the chart's ServiceAccount: request phase %q, APIServiceNamespace namespace %q after %v", phase, child, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := consumer.Resource(kb("apiserviceexports")).Namespace(ns).Get(ctx, "mangodbs.example.com", metav1.GetOptions{}); err != nil {
		t.Errorf("the APIServiceExport, read with the issued kubeconfig: %v", err)
	}
}

// backendSAConfig is a client config with a token of the chart's
// ServiceAccount: the backend's rights exactly.
func backendSAConfig(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, admin kubernetes.Interface) *rest.Config {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, fullname, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cp.ConfigForToken(tr.Status.Token)
}
