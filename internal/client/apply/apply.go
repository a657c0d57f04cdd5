// Package apply completes a kube-bind binding in the consumer's cluster,
// leaving exactly the state the released konnector expects (v0.4.8 for a
// kube-bind.io/v1alpha1 binding, v0.8.2 for v1alpha2): namespace
// kube-bind, the provider's kubeconfig in a Secret there (found again and
// updated on a rebind), each APIServiceExportRequest created on the
// provider and waited for, the konnector with a least-privilege
// ClusterRole, and one APIServiceBinding per request. It also keeps the
// cluster's identity at each provider (identity.go), so a bind from any
// machine lands in the same provider namespace, and tells from the
// konnector found in the cluster which generations a bind can take
// (detect.go).
//
// Every step is idempotent: a bind interrupted anywhere is finished by
// running it again. Before it changes anything it refuses to take over an
// APIServiceBinding of another provider or a CRD no binding of this name
// owns.
package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kjson "sigs.k8s.io/json"
)

// Options configure a Binder; the zero values of the optional ones are
// the defaults named.
type Options struct {
	// Config is the consumer cluster (required).
	Config *rest.Config
	// KonnectorImage defaults to the generation's konnector
	// (DefaultKonnector, DefaultKonnectorV1alpha2).
	KonnectorImage string
	// SkipKonnector leaves the konnector (Deployment, ServiceAccount, RBAC)
	// alone: someone else runs it.
	SkipKonnector bool
	// WaitTimeout bounds each wait (a request's phase, the konnector's
	// CRD); default 5 minutes.
	WaitTimeout time.Duration
	// Progress receives one line per step with its duration; nil discards.
	Progress io.Writer
}

// Binder does the consumer side of binds into one cluster.
type Binder struct {
	o    Options
	kube kubernetes.Interface
	dyn  dynamic.Interface
	crds apiextensionsclient.Interface
	// dryRun and planned: Plan's copy changes nothing and collects what it
	// would write.
	dryRun  bool
	planned []runtime.Object
	// newProviderClient makes the client for the provider cluster from the
	// issued kubeconfig (replaced in narrow tests).
	newProviderClient func(kubeconfig []byte) (dynamic.Interface, error)
}

// New validates o and makes the clients.
func New(o Options) (*Binder, error) {
	if o.Config == nil {
		return nil, errors.New("consumer: Options.Config is required")
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = 5 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	o.Config = unthrottled(o.Config)
	b := &Binder{o: o, newProviderClient: providerClient}
	var err error
	if b.kube, err = kubernetes.NewForConfig(o.Config); err != nil {
		return nil, err
	}
	if b.dyn, err = dynamic.NewForConfig(o.Config); err != nil {
		return nil, err
	}
	if b.crds, err = apiextensionsclient.NewForConfig(o.Config); err != nil {
		return nil, err
	}
	return b, nil
}

func providerClient(kubeconfig []byte) (dynamic.Interface, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the provider's kubeconfig: %w", err)
	}
	return dynamic.NewForConfig(unthrottled(cfg))
}

// unthrottled returns a copy of cfg whose requests do not queue behind
// client-go's default 5 a second: a bind makes a few dozen (RBAC, the
// konnector, one binding per API, and the polls that wait for each). A QPS
// set by the caller stays.
func unthrottled(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	return cfg
}

// Check makes sure the consumer cluster answers and lets us read
// namespace kube-bind, before the user spends time in a browser.
func (b *Binder) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := b.kube.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx); err != nil {
		return fmt.Errorf("the consumer cluster at %s does not answer: %w", b.o.Config.Host, err)
	}
	if _, err := b.kube.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("the consumer cluster at %s: reading namespace %s: %w", b.o.Config.Host, Namespace, err)
	}
	return nil
}

// Plan returns, in order, what a bind through protocol would create or
// update in the cluster before the provider's answer is known: namespace
// kube-bind and, unless SkipKonnector, the konnector with its rights for
// the APIs bound so far. It changes nothing. The kubeconfig Secret, the
// requests and the APIServiceBindings depend on the APIs picked in the
// browser, so a plan has none of them.
func (bd *Binder) Plan(ctx context.Context, protocol string) ([]runtime.Object, error) {
	gen, err := generationOf(protocol)
	if err != nil {
		return nil, err
	}
	d := &Binder{o: bd.o, kube: bd.kube, dyn: bd.dyn, crds: bd.crds, dryRun: true}
	if err := d.step("namespace "+Namespace, func() (string, error) { return d.ensureNamespace(ctx) }); err != nil {
		return nil, err
	}
	if err := d.konnector(ctx, nil, gen); err != nil {
		return nil, err
	}
	return d.planned, nil
}

func (bd *Binder) plan(o runtime.Object) { bd.planned = append(bd.planned, o) }

// Binding is what a provider handed over, to complete in the cluster.
type Binding struct {
	// Protocol is the generation of the BindingResponse, ProtocolV1alpha1
	// ("" too) or ProtocolV1alpha2.
	Protocol string
	// ExportURL is the provider's export URL (its host keys the identity).
	ExportURL string
	// Identity to keep for the provider (the cluster ID of the session).
	Identity Identity
	// Kubeconfig the provider issued; Server and Namespace are its current
	// context's (pollclient.Result has them).
	Kubeconfig        []byte
	Server, Namespace string
	// Requests are the BindingResponse's APIServiceExportRequests, of the
	// Protocol's generation.
	Requests []json.RawMessage
}

// Outcome is what Bind left in the cluster.
type Outcome struct {
	SecretName string
	Bindings   []string
	// BindingObjects are the APIServiceBindings as the cluster returned
	// them, in the order of Bindings.
	BindingObjects []*unstructured.Unstructured
}

// request is one APIServiceExportRequest of a BindingResponse.
type request struct {
	name      string
	resources []GroupResource
	// claims are the resources of its permission claims, namespaces
	// whether it asks for namespaces on the consumer side (v1alpha2).
	claims     []GroupResource
	namespaces bool
	raw        map[string]any
}

// Bind completes b in the cluster. Its errors say what failed and leave
// nothing a rerun cannot finish.
func (bd *Binder) Bind(ctx context.Context, b Binding) (*Outcome, error) {
	gen, err := generationOf(b.Protocol)
	if err != nil {
		return nil, err
	}
	reqs, err := parseRequests(b.Requests, gen)
	if err != nil {
		return nil, err
	}
	providerKey, err := ProviderKey(b.ExportURL)
	if err != nil {
		return nil, err
	}
	out := &Outcome{}

	// Read-only first: which Secret is this provider's, and would any
	// binding take over what is not ours.
	if err := bd.step("checking for conflicts", func() (string, error) {
		name, err := bd.findKubeconfigSecret(ctx, b.Server, b.Namespace)
		if err != nil {
			return "", err
		}
		out.SecretName = name
		if err := bd.checkConflicts(ctx, reqs, name, gen); err != nil {
			return "", err
		}
		if name == "" {
			return "none (first bind to this provider namespace)", nil
		}
		return "none; kubeconfig Secret " + Namespace + "/" + name + " is this provider's", nil
	}); err != nil {
		return nil, err
	}
	if err := bd.step("namespace "+Namespace, func() (string, error) { return bd.ensureNamespace(ctx) }); err != nil {
		return nil, err
	}
	if err := bd.step("cluster identity", func() (string, error) { return bd.saveIdentity(ctx, providerKey, b.Identity) }); err != nil {
		return nil, err
	}
	if err := bd.step("kubeconfig Secret", func() (string, error) {
		name, msg, err := bd.ensureKubeconfigSecret(ctx, out.SecretName, b.Kubeconfig, gen)
		out.SecretName = name
		return msg, err
	}); err != nil {
		return nil, err
	}
	provider, err := bd.newProviderClient(b.Kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := bd.step("APIServiceExportRequest "+r.name, func() (string, error) {
			return bd.request(ctx, provider, b.Namespace, r, gen)
		}); err != nil {
			return nil, err
		}
	}
	if err := bd.konnector(ctx, reqs, gen); err != nil {
		return nil, err
	}
	if err := bd.step(gen.groupVersion+" APIServiceBindings served (the konnector installs their CRD)", func() (string, error) {
		return bd.waitForBindingsAPI(ctx, gen)
	}); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		var obj *unstructured.Unstructured
		if err := bd.step("APIServiceBinding "+r.name, func() (msg string, err error) {
			obj, msg, err = bd.ensureBinding(ctx, r.name, out.SecretName, gen)
			return msg, err
		}); err != nil {
			return nil, err
		}
		out.Bindings = append(out.Bindings, r.name)
		out.BindingObjects = append(out.BindingObjects, obj)
	}
	return out, nil
}

// konnector writes the konnector's rights for reqs and the APIs bound
// so far, then its Deployment, unless SkipKonnector. Which konnector will
// run decides its rights, so it is settled first.
func (bd *Binder) konnector(ctx context.Context, reqs []request, gen generation) error {
	if bd.o.SkipKonnector {
		return nil
	}
	kp, err := bd.planKonnector(ctx, gen)
	if err != nil {
		return fmt.Errorf("konnector Deployment: %w", err)
	}
	if err := bd.step("konnector RBAC", func() (string, error) { return bd.ensureKonnectorRBAC(ctx, reqs, kp.gen) }); err != nil {
		return err
	}
	return bd.step("konnector Deployment", func() (string, error) { return bd.ensureKonnector(ctx, kp) })
}

// step runs f and reports it on one line with its duration.
func (bd *Binder) step(what string, f func() (string, error)) error {
	start := time.Now()
	msg, err := f()
	d := time.Since(start).Round(time.Millisecond)
	if err != nil {
		fmt.Fprintf(bd.o.Progress, "  ✗ %s: %v (%s)\n", what, err, d)
		return fmt.Errorf("%s: %w", what, err)
	}
	fmt.Fprintf(bd.o.Progress, "  ✓ %s: %s (%s)\n", what, msg, d)
	return nil
}

func parseRequests(raws []json.RawMessage, gen generation) ([]request, error) {
	if len(raws) == 0 {
		return nil, errors.New("the provider's answer holds no APIServiceExportRequest: nothing to bind")
	}
	var out []request
	seen := map[string]bool{}
	for i, raw := range raws {
		var r struct {
			APIVersion string `json:"apiVersion"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Resources        []GroupResource  `json:"resources"`
				PermissionClaims []GroupResource  `json:"permissionClaims"`
				Namespaces       []map[string]any `json:"namespaces"`
			} `json:"spec"`
		}
		var obj map[string]any
		// Case-sensitive: the checks below must read the very fields the
		// object keeps when it is passed on (encoding/json would take
		// "ApiVersion" for apiVersion).
		if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &r); err != nil {
			return nil, fmt.Errorf("requests[%d]: %w", i, err)
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("requests[%d]: %w", i, err)
		}
		if r.APIVersion != gen.groupVersion {
			return nil, fmt.Errorf("requests[%d] is %q, want %q", i, r.APIVersion, gen.groupVersion)
		}
		if r.Metadata.Name == "" || len(r.Spec.Resources) == 0 {
			return nil, fmt.Errorf("requests[%d] has no name or no resources", i)
		}
		// The name becomes an object's name on both clusters: refuse one
		// the API servers would, before anything is written.
		if errs := validation.IsDNS1123Subdomain(r.Metadata.Name); len(errs) > 0 {
			return nil, fmt.Errorf("requests[%d]: name %q: %s", i, r.Metadata.Name, strings.Join(errs, "; "))
		}
		if seen[r.Metadata.Name] {
			return nil, fmt.Errorf("requests[%d]: %s comes twice", i, r.Metadata.Name)
		}
		seen[r.Metadata.Name] = true
		for _, gr := range append(append([]GroupResource(nil), r.Spec.Resources...), r.Spec.PermissionClaims...) {
			if gr.Resource == "" || strings.ContainsAny(gr.Resource+gr.Group, "/ *") {
				return nil, fmt.Errorf("requests[%d]: bad resource %q in group %q", i, gr.Resource, gr.Group)
			}
		}
		out = append(out, request{name: r.Metadata.Name, resources: r.Spec.Resources,
			claims: r.Spec.PermissionClaims, namespaces: len(r.Spec.Namespaces) > 0, raw: obj})
	}
	return out, nil
}

func (bd *Binder) ensureNamespace(ctx context.Context) (string, error) {
	_, err := bd.kube.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
	if err == nil {
		return "exists", nil
	}
	if !apierrors.IsNotFound(err) {
		return "", err
	}
	if bd.dryRun {
		bd.plan(namespaceObject())
		return "would create it", nil
	}
	if _, err := bd.kube.CoreV1().Namespaces().Create(ctx, namespaceObject(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return "created", nil
}

// findKubeconfigSecret returns the name of the Secret in kube-bind whose
// kubeconfig names server and namespace, as the released CLI finds it, or
// "" when there is none.
func (bd *Binder) findKubeconfigSecret(ctx context.Context, server, namespace string) (string, error) {
	list, err := bd.kube.CoreV1().Secrets(Namespace).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("listing Secrets in %s: %w", Namespace, err)
	}
	for _, s := range list.Items {
		data, ok := s.Data[KubeconfigKey]
		if !ok {
			continue
		}
		cfg, err := clientcmd.Load(data)
		if err != nil {
			continue
		}
		kctx, ok := cfg.Contexts[cfg.CurrentContext]
		if !ok || kctx == nil {
			continue
		}
		c, ok := cfg.Clusters[kctx.Cluster]
		if ok && c != nil && c.Server == server && kctx.Namespace == namespace {
			return s.Name, nil
		}
	}
	return "", nil
}

func (bd *Binder) ensureKubeconfigSecret(ctx context.Context, name string, kubeconfig []byte, gen generation) (string, string, error) {
	secrets := bd.kube.CoreV1().Secrets(Namespace)
	want := kubeconfigSecret(name, kubeconfig, gen)
	if name == "" {
		s, err := secrets.Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return "", "", err
		}
		return s.Name, "created " + Namespace + "/" + s.Name, nil
	}
	cur, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	labelled := true
	for k, v := range want.Labels {
		labelled = labelled && cur.Labels[k] == v
	}
	if string(cur.Data[KubeconfigKey]) == string(kubeconfig) && labelled {
		return name, Namespace + "/" + name + " up to date", nil
	}
	if cur.Data == nil {
		cur.Data = map[string][]byte{}
	}
	cur.Data[KubeconfigKey] = kubeconfig
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		cur.Labels[k] = v
	}
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return "", "", err
	}
	return name, "updated " + Namespace + "/" + name, nil
}

// checkConflicts refuses, before anything is changed, bindings that would
// take over an APIServiceBinding of another provider (another Secret) or a
// CRD that no APIServiceBinding of its name owns.
func (bd *Binder) checkConflicts(ctx context.Context, reqs []request, secretName string, gen generation) error {
	for _, r := range reqs {
		got, err := bd.getBinding(ctx, r.name, gen)
		switch {
		case err != nil:
			return fmt.Errorf("reading APIServiceBinding %s: %w", r.name, err)
		case got != nil:
			ns, _, _ := unstructured.NestedString(got.Object, "spec", "kubeconfigSecretRef", "namespace")
			name, _, _ := unstructured.NestedString(got.Object, "spec", "kubeconfigSecretRef", "name")
			if ns != Namespace || name == "" || name != secretName {
				return fmt.Errorf("APIServiceBinding %s exists and is not from this service provider (it uses Secret %s/%s); "+
					"refusing to take it over (delete it first if it is no longer used)", r.name, ns, name)
			}
		}
		for _, gr := range r.resources {
			crd, err := bd.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, gr.Name(), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("reading CRD %s: %w", gr.Name(), err)
			}
			owned := false
			for _, ref := range crd.OwnerReferences {
				if ref.Kind == "APIServiceBinding" && strings.HasPrefix(ref.APIVersion, "kube-bind.io/") && ref.Name == r.name {
					owned = true
				}
			}
			if !owned {
				return fmt.Errorf("CRD %s exists in this cluster and is not owned by APIServiceBinding %s; "+
					"binding would take over an API of this cluster, refusing", gr.Name(), r.name)
			}
		}
	}
	return nil
}

// request creates one APIServiceExportRequest in the provider namespace and
// waits until the provider says Succeeded. One that Failed before (a
// rerun) is made again; its spec is immutable.
func (bd *Binder) request(ctx context.Context, provider dynamic.Interface, namespace string, r request, gen generation) (string, error) {
	obj := &unstructured.Unstructured{Object: map[string]any{}}
	for k, v := range r.raw {
		obj.Object[k] = v
	}
	obj.SetNamespace(namespace)
	obj.SetName(r.name)
	client := provider.Resource(gen.requestGVR).Namespace(namespace)
	created := "created"
	if _, err := client.Create(ctx, obj, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		created = "exists"
		cur, err := client.Get(ctx, r.name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if phase, _, _ := unstructured.NestedString(cur.Object, "status", "phase"); phase == "Failed" {
			if err := client.Delete(ctx, r.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return "", err
			}
			if err := bd.await(ctx, wait{
				what:  fmt.Sprintf("the failed APIServiceExportRequest %s/%s of an earlier run to be deleted on the provider", namespace, r.name),
				ifNot: "something on the provider keeps it (a finalizer?); ask the provider, then run the command again",
			}, func(ctx context.Context) (bool, error) {
				_, err := client.Get(ctx, r.name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), ignoreNotFound(err)
			}); err != nil {
				return "", err
			}
			if _, err := client.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				return "", err
			}
			created = "made again (the earlier one had failed)"
		}
	} else if err != nil {
		return "", fmt.Errorf("creating it in provider namespace %s: %w", namespace, err)
	}
	var phase, message string
	err := bd.await(ctx, wait{
		what: fmt.Sprintf("the provider to accept APIServiceExportRequest %s/%s (status.phase Succeeded)", namespace, r.name),
		ifNot: "the provider's backend decides requests; if the phase stays empty or Pending, it is down or behind: " +
			"ask the provider, then run the command again (it continues where it stopped)",
		seen: func() string {
			if phase == "" {
				return "no phase yet"
			}
			return "phase " + phase
		},
	}, func(ctx context.Context) (bool, error) {
		cur, err := client.Get(ctx, r.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase, _, _ = unstructured.NestedString(cur.Object, "status", "phase")
		message, _, _ = unstructured.NestedString(cur.Object, "status", "terminalMessage")
		return phase == "Succeeded" || phase == "Failed", nil
	})
	switch {
	case err != nil:
		return "", err
	case phase == "Failed":
		if message == "" {
			message = "no message given"
		}
		return "", &RequestFailedError{Name: r.name, Message: message}
	}
	return created + ", Succeeded", nil
}

// RequestFailedError is a request the provider refused, with its message.
type RequestFailedError struct{ Name, Message string }

func (e *RequestFailedError) Error() string {
	return fmt.Sprintf("the provider failed APIServiceExportRequest %s: %s", e.Name, e.Message)
}

// wait is what a bounded wait waits for, in the words shown to the user.
type wait struct {
	// what comes, e.g. "the provider to decide APIServiceExportRequest ns/x".
	what string
	// ifNot is what to do when it does not come.
	ifNot string
	// seen, when set, says what was last seen instead.
	seen func() string
}

// await runs cond every half second until it holds, fails with an error
// that is not transient, or WaitTimeout passes. Once cond first does not
// hold it says what it waits for and how long at most; at the bound it
// fails with w's advice.
func (bd *Binder) await(ctx context.Context, w wait, cond func(context.Context) (bool, error)) error {
	wctx, cancel := context.WithTimeout(ctx, bd.o.WaitTimeout)
	defer cancel()
	var lastErr error
	for announced := false; ; announced = true {
		ok, err := cond(wctx)
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
			if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				return err
			}
		}
		if !announced {
			fmt.Fprintf(bd.o.Progress, "  … waiting up to %s (--wait-timeout) for %s\n", bd.o.WaitTimeout, w.what)
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			msg := fmt.Sprintf("gave up after %s (--wait-timeout) waiting for %s", bd.o.WaitTimeout, w.what)
			switch {
			case w.seen != nil:
				msg += " (last seen: " + w.seen() + ")"
			case lastErr != nil:
				msg += fmt.Sprintf(" (last error: %v)", lastErr)
			}
			return &WaitTimeoutError{Msg: msg + "; " + w.ifNot}
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// WaitTimeoutError is a bounded wait that ran out, with what to do.
type WaitTimeoutError struct{ Msg string }

func (e *WaitTimeoutError) Error() string { return e.Msg }

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
