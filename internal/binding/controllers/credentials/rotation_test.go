package credentials_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

const (
	backendUser = "kube-bind-backend-credentials-test"
	prefix      = "kbc-"
)

func poll(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("timed out after %s waiting until %s: %v", timeout, what, err)
	}
}

// TestRotationWithReleasedKonnector rotates the token of a consumer whose
// released konnector v0.4.8 runs as a process against a consumer control
// plane: the konnector picks the new kubeconfig up from the provider-side
// Secret, the old token is rejected by the API server once the konnector
// switched, objects created after that still sync, and no object waited
// longer than one konnector resync (its heartbeat interval) meanwhile.
func TestRotationWithReleasedKonnector(t *testing.T) {
	const overlap = 15 * time.Second
	ctx, provider, provisioner := startProvider(t, overlap)
	admin := provider.AdminConfig()
	adminKube := kubernetes.NewForConfigOrDie(admin)
	adminDyn := dynamic.NewForConfigOrDie(admin)

	// The bind, as the browser's POST /bind does it.
	resp, err := provisioner.Provision(ctx, binding.Consumer{Issuer: "https://idp.example.com", Subject: "rotation"}, "cluster1",
		[]binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}})
	if err != nil {
		t.Fatal(err)
	}
	issued, err := clientcmd.Load(resp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := issued.Contexts[issued.CurrentContext].Namespace
	oldRC, err := clientcmd.RESTConfigFromKubeConfig(resp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	oldToken := kubernetes.NewForConfigOrDie(oldRC)
	consumerOnProvider := dynamic.NewForConfigOrDie(oldRC)
	// The request, created with the issued kubeconfig as the CLI does.
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": "mangodbs.mangodb.com"},
		"spec":     map[string]any{"resources": []any{map[string]any{"group": "mangodb.com", "resource": "mangodbs"}}},
	}}
	poll(t, "the request is created", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := consumerOnProvider.Resource(kbresources.APIServiceExportRequests).Namespace(ns).Create(ctx, req, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})
	poll(t, "the request Succeeded", 30*time.Second, func(ctx context.Context) (bool, error) {
		u, err := consumerOnProvider.Resource(kbresources.APIServiceExportRequests).Namespace(ns).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return err == nil && phase == "Succeeded", nil
	})

	// The consumer: its own control plane, the kubeconfig Secret and an
	// APIServiceBinding as the released CLI leaves them, and the released
	// konnector as a process.
	consumerCP, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consumerCP.Stop)
	consumerKube := kubernetes.NewForConfigOrDie(consumerCP.AdminConfig())
	consumerDyn := dynamic.NewForConfigOrDie(consumerCP.AdminConfig())
	if _, err := consumerKube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-bind"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const consumerSecret = "kubeconfig-rot01"
	if _, err := consumerKube.CoreV1().Secrets("kube-bind").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: consumerSecret},
		Data:       map[string][]byte{"kubeconfig": resp.Kubeconfig},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k := konnector.Start(t, konnector.Options{Kubeconfig: consumerCP.AdminKubeconfigPath(), Servers: []string{provider.Host()}})
	crds := apiextensionsclient.NewForConfigOrDie(consumerCP.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	poll(t, "the konnector installed the APIServiceBinding CRD", 2*time.Minute, func(ctx context.Context) (bool, error) {
		if done, err := k.Exited(); done {
			return false, fmt.Errorf("konnector exited: %w", err)
		}
		_, err := crds.Get(ctx, "apiservicebindings.kube-bind.io", metav1.GetOptions{})
		return err == nil, nil
	})
	apiBinding := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceBinding",
		"metadata": map[string]any{"name": "mangodbs.mangodb.com"},
		"spec": map[string]any{"kubeconfigSecretRef": map[string]any{
			"namespace": "kube-bind", "name": consumerSecret, "key": "kubeconfig",
		}},
	}}
	poll(t, "the APIServiceBinding is created", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := consumerDyn.Resource(kbresources.APIServiceBindings).Create(ctx, apiBinding, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})

	// synced creates a MangoDB in the consumer cluster and waits until the
	// konnector created it in the provider cluster; it returns the wait.
	synced := func(ctx context.Context, name string, timeout time.Duration) (time.Duration, error) {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "mangodb.com/v1alpha1", "kind": "MangoDB",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"size": int64(1)},
		}}
		start := time.Now()
		// A CRD the konnector just made is served a moment after it exists.
		var createErr error
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, createErr = consumerDyn.Resource(exampleapis.MangoDB.GVR()).Namespace("default").Create(ctx, obj, metav1.CreateOptions{})
			return !apierrors.IsNotFound(createErr), nil
		}); err != nil || createErr != nil {
			return 0, errors.Join(createErr, err)
		}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			list, err := adminDyn.Resource(exampleapis.MangoDB.GVR()).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, item := range list.Items {
				if item.GetName() == name && strings.HasPrefix(item.GetNamespace(), prefix) {
					return true, nil
				}
			}
			return false, nil
		})
		return time.Since(start), err
	}
	poll(t, "the konnector installed the MangoDB CRD in the consumer cluster", 3*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := crds.Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
		return err == nil, nil
	})
	if took, err := synced(ctx, "before-rotation", 3*time.Minute); err != nil {
		t.Fatalf("an object created before the rotation did not sync: %v", err)
	} else {
		t.Logf("before the rotation, an object synced in %s", took.Round(time.Millisecond))
	}
	cb, err := adminDyn.Resource(kbresources.ClusterBindings).Namespace(ns).Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resync := 5 * time.Minute
	if s, _, _ := unstructured.NestedString(cb.Object, "status", "heartbeatInterval"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			resync = d
		}
	}
	t.Logf("the konnector's heartbeat interval (its resync of the ClusterBinding): %s", resync)

	// A prober creates an object every second and measures how long each
	// takes to reach the provider, through the rotation and revocation.
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probeMu sync.Mutex
	var longest time.Duration
	var probes int
	var probeErr error
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for i := 0; probeCtx.Err() == nil; i++ {
			took, err := synced(probeCtx, fmt.Sprintf("probe-%d", i), resync)
			probeMu.Lock()
			if err != nil && probeCtx.Err() == nil {
				probeErr = fmt.Errorf("probe-%d: %w", i, err)
			}
			if err == nil {
				probes++
				longest = max(longest, took)
			}
			probeMu.Unlock()
			if err != nil {
				return
			}
			time.Sleep(time.Second)
		}
	}()

	// Rotate, as an operator would ask for it (the controller also does so
	// on its own at 80% of the lifetime).
	kc, err := adminKube.CoreV1().Secrets(ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldSecret := kc.Annotations[binding.AnnotationTokenSecret]
	rotateAt := time.Now().UTC().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(rotateAt))
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, credentials.AnnotationRotate, rotateAt.Format(time.RFC3339))
	if _, err := adminDyn.Resource(kbresources.ClusterBindings).Namespace(ns).Patch(ctx, "cluster", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var newKubeconfig []byte
	poll(t, "the controller rotated the token", time.Minute, func(ctx context.Context) (bool, error) {
		kc, err := adminKube.CoreV1().Secrets(ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
		if err != nil || kc.Annotations[binding.AnnotationTokenSecret] == oldSecret {
			return false, nil
		}
		newKubeconfig = kc.Data[binding.KubeconfigSecretKey]
		return true, nil
	})
	rotated := time.Now()
	t.Logf("rotated: the kubeconfig Secret names a new token")
	poll(t, "the konnector copied the new kubeconfig into the consumer cluster", resync, func(ctx context.Context) (bool, error) {
		s, err := consumerKube.CoreV1().Secrets("kube-bind").Get(ctx, consumerSecret, metav1.GetOptions{})
		return err == nil && bytes.Equal(s.Data["kubeconfig"], newKubeconfig), nil
	})
	t.Logf("the konnector has the new kubeconfig %s after the rotation", time.Since(rotated).Round(time.Millisecond))
	poll(t, "the old token is rejected by the API server", resync+overlap+time.Minute, func(ctx context.Context) (bool, error) {
		_, err := oldToken.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsUnauthorized(err), nil
	})
	t.Logf("the old token is rejected %s after the rotation", time.Since(rotated).Round(time.Millisecond))

	// After the revocation the konnector still syncs, with the new token.
	if took, err := synced(ctx, "after-revocation", resync); err != nil {
		t.Fatalf("an object created after the old token's revocation did not sync: %v", err)
	} else {
		t.Logf("after the revocation, a new object synced in %s", took.Round(time.Millisecond))
	}
	stopProbe()
	<-probeDone
	probeMu.Lock()
	defer probeMu.Unlock()
	if probeErr != nil {
		t.Errorf("during the rotation: %v", probeErr)
	}
	t.Logf("%d probe objects synced during the rotation; the longest took %s", probes, longest.Round(time.Millisecond))
	if probes == 0 || longest >= resync {
		t.Errorf("sync was interrupted: %d probes, longest %s, want all under one resync (%s)", probes, longest, resync)
	}
	cb, err = adminDyn.Resource(kbresources.ClusterBindings).Namespace(ns).Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	found := false
	for _, c := range conds {
		m := c.(map[string]any)
		if m["type"] == credentials.ConditionType {
			found = true
			if m["status"] != "True" {
				t.Errorf("condition %v", m)
			}
		}
	}
	if !found {
		t.Errorf("no %s condition on the ClusterBinding: %v", credentials.ConditionType, conds)
	}
	if strings.Contains(k.Log(), "Unauthorized") {
		t.Logf("konnector log mentions Unauthorized (old watches closing):\n%s", k.Log())
	}
}

// startProvider prepares the provider control plane (kube-bind CRDs, RBAC,
// MangoDB exported) and runs catalog, provisioner and both controllers as a
// user holding only the backend's ClusterRole, as in production, until the
// test ends.
func startProvider(t *testing.T, overlap time.Duration) (context.Context, *controlplane.ControlPlane, *binding.Provisioner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	provider := controlplane.Get(t)
	backend := backendcluster.Backend(t, provider, backendUser, exampleapis.MangoDB)
	catalog := backendcluster.Catalog(t, backend, exampleapis.MangoDB)
	provisioner, err := binding.NewProvisioner(backend, catalog, binding.Config{
		NamespacePrefix: prefix, ProviderPrettyName: "Rotation Test", TokenLifetime: binding.MinTokenLifetime,
	})
	if err != nil {
		t.Fatal(err)
	}
	exportsCtrl, err := exportrequests.New(exportrequests.Config{Catalog: catalog, GrantBackend: provisioner.GrantBackend, NamespacePrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	credCtrl, err := credentials.New(credentials.Config{
		Policy:          credentials.Policy{Lifetime: binding.MinTokenLifetime, RotationPoint: 0.8, Overlap: overlap},
		Issuer:          provisioner,
		NamespacePrefix: prefix,
	})
	if err != nil {
		t.Fatal(err)
	}
	backendcluster.Run(t, "the exports and credentials controllers", func(ctx context.Context) error {
		kbmanager.Run(ctx, backend, kbmanager.Options{}, exportsCtrl.Setup, credCtrl.Setup)
		return nil
	})
	return ctx, provider, provisioner
}

// A binding made before TokenRequest tokens (a legacy token Secret, a
// kubeconfig Secret without annotations) is migrated: the controller
// issues an expiring token, keeps the legacy one until the konnector's
// heartbeat shows it switched, then deletes it. An operator's revocation
// of the current token is reported, not undone, and a rebind recovers.
func TestLegacyMigrationRevocationAndRebind(t *testing.T) {
	const overlap = 2 * time.Second
	ctx, provider, provisioner := startProvider(t, overlap)
	admin := provider.AdminConfig()
	kube := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)
	consumer := binding.Consumer{Issuer: "https://idp.example.com", Subject: "legacy"}
	mango := []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}
	if _, err := provisioner.Provision(ctx, consumer, "cluster1", mango); err != nil {
		t.Fatal(err)
	}
	ns := provisioner.Namespace(consumer, "cluster1")
	secrets := kube.CoreV1().Secrets(ns)

	// Turn it into a binding of the previous version.
	if _, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: binding.TokenSecretName, Annotations: map[string]string{corev1.ServiceAccountNameKey: binding.ServiceAccountName}},
		Type:       corev1.SecretTypeServiceAccountToken,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var legacyToken []byte
	poll(t, "the token controller filled the legacy Secret", 30*time.Second, func(ctx context.Context) (bool, error) {
		s, err := secrets.Get(ctx, binding.TokenSecretName, metav1.GetOptions{})
		legacyToken = s.Data[corev1.ServiceAccountTokenKey]
		return err == nil && len(legacyToken) > 0, nil
	})
	if err := secrets.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: binding.LabelCredential + "=" + binding.CredentialToken}); err != nil {
		t.Fatal(err)
	}
	kc, err := secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc.Annotations = nil
	if _, err := secrets.Update(ctx, kc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	legacy := kubernetes.NewForConfigOrDie(provider.ConfigForToken(string(legacyToken)))

	// heartbeat writes one as the konnector does, which also wakes the
	// controller; each is at least a second after the last (RFC 3339 has
	// seconds, and an unchanged value would be no update).
	var last time.Time
	heartbeat := func(at time.Time) {
		t.Helper()
		at = at.Truncate(time.Second)
		if !at.After(last) {
			at = last.Add(time.Second)
		}
		last = at
		patch := fmt.Sprintf(`{"status":{"lastHeartbeatTime":%q,"heartbeatInterval":"5m"}}`, at.UTC().Format(time.RFC3339))
		if _, err := dyn.Resource(kbresources.ClusterBindings).Namespace(ns).Patch(ctx, "cluster", types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	condition := func() map[string]any { return credentialsCondition(ctx, t, dyn, ns) }
	heartbeat(time.Now())
	var current string
	poll(t, "the legacy token was replaced by an expiring one", 30*time.Second, func(ctx context.Context) (bool, error) {
		kc, err := secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
		current = kc.Annotations[binding.AnnotationTokenSecret]
		return err == nil && current != "" && kc.Annotations[binding.AnnotationExpiresAt] != "", nil
	})
	// The replacement is one look, the retirement mark the next one.
	poll(t, "the legacy Secret is kept and marked retired", 30*time.Second, func(ctx context.Context) (bool, error) {
		s, err := secrets.Get(ctx, binding.TokenSecretName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("the legacy Secret is gone after the migration: %w", err)
		}
		return s.Annotations[binding.AnnotationRetiredAt] != "", nil
	})
	if _, err := legacy.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("the legacy token stopped working before the konnector switched: %v", err)
	}
	// A heartbeat after the overlap: the legacy token is deleted and dies.
	time.Sleep(overlap + time.Second)
	heartbeat(time.Now())
	poll(t, "the legacy token is rejected", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := legacy.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsUnauthorized(err), nil
	})
	if _, err := secrets.Get(ctx, binding.TokenSecretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("legacy Secret after the switch: %v, want NotFound", err)
	}
	poll(t, "the condition is True", 30*time.Second, func(context.Context) (bool, error) {
		c := condition()
		return c != nil && c["status"] == "True" && c["reason"] == credentials.ReasonValid, nil
	})

	// The provider revokes the current token at once; it is reported, and
	// no new token is handed out in its place.
	kc, err = secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kc.Data[binding.KubeconfigSecretKey])
	if err != nil {
		t.Fatal(err)
	}
	currentClient := kubernetes.NewForConfigOrDie(rc)
	if err := secrets.Delete(ctx, current, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	poll(t, "the revoked token is rejected", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := currentClient.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsUnauthorized(err), nil
	})
	t.Logf("a token whose Secret was deleted is rejected %s later", time.Since(revoked).Round(10*time.Millisecond))
	heartbeat(time.Now())
	poll(t, "the condition says the credential was revoked", 30*time.Second, func(context.Context) (bool, error) {
		c := condition()
		return c != nil && c["status"] == "False" && c["reason"] == credentials.ReasonRevoked, nil
	})
	if kc, err := secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{}); err != nil || kc.Annotations[binding.AnnotationTokenSecret] != current {
		t.Errorf("after a revocation the kubeconfig Secret names %q (%v), want the revoked %q kept", kc.Annotations[binding.AnnotationTokenSecret], err, current)
	}

	// A rebind recovers.
	resp, err := provisioner.Provision(ctx, consumer, "cluster1", mango)
	if err != nil {
		t.Fatal(err)
	}
	rc, err = clientcmd.RESTConfigFromKubeConfig(resp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("the rebind's token: %v", err)
	}
	heartbeat(time.Now())
	poll(t, "the condition is True again after the rebind", 30*time.Second, func(context.Context) (bool, error) {
		c := condition()
		return c != nil && c["status"] == "True", nil
	})
}

// credentialsCondition is the CredentialsValid condition of the
// ClusterBinding in ns, or nil.
func credentialsCondition(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns string) map[string]any {
	t.Helper()
	cb, err := dyn.Resource(kbresources.ClusterBindings).Namespace(ns).Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	for _, c := range conds {
		if m := c.(map[string]any); m["type"] == credentials.ConditionType {
			return m
		}
	}
	return nil
}
