package binding

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// Config configures provisioning (the backend's flags of the same names).
type Config struct {
	// NamespacePrefix starts every provider namespace name (--namespace-prefix).
	NamespacePrefix string
	// ProviderPrettyName goes into each ClusterBinding (--pretty-name).
	ProviderPrettyName string
	// ExternalAddress is the provider API server URL consumers use
	// (--external-address); empty means the backend's own.
	ExternalAddress string
	// ExternalCA is that server's PEM CA bundle (the content of
	// --external-ca-file, checked with CheckCABundle); empty means the
	// backend's own CA.
	ExternalCA []byte
	// ExternalServerName is an optional TLS server name for the issued
	// kubeconfig (--external-server-name).
	ExternalServerName string
	// TokenLifetime is the lifetime asked for each issued token
	// (--credential-lifetime); 0 means DefaultTokenLifetime. The API
	// server may cap it (--service-account-max-token-expiration).
	TokenLifetime time.Duration
	// Now is the clock of issue and retirement times (default time.Now).
	Now func() time.Time
	// Timeout bounds a whole Provision or Unbind, so that an API server
	// that accepts connections but never answers cannot hang a bind;
	// 0 means 60s.
	Timeout time.Duration
	// Quota caps what the consumer creates in its namespace; the zero
	// value means DefaultQuota.
	Quota Quota
	// MaxClustersPerUser caps the provider namespaces (consumer clusters)
	// of one user (issuer and subject) across every flow
	// (--max-clusters-per-user); 0 means DefaultMaxClustersPerUser.
	MaxClustersPerUser int
}

// Resource is one API a consumer selected, and the request the consumer
// will bind it through.
type Resource struct {
	Group    string
	Resource string
	// Request names that request ("" means the resource's own name,
	// RequestName). A returning consumer may bind a resource again only
	// through the request it is bound by already (AlreadyBoundError).
	Request string
}

// Names of the objects in a provider namespace.
const (
	ServiceAccountName     = "kube-bind-consumer"
	ConsumerRoleBinding    = "kube-bind-consumer"
	KubeconfigSecretName   = "kubeconfig"
	KubeconfigSecretKey    = "kubeconfig"
	ClusterBindingName     = "cluster"
	fieldManager           = "kube-bind-backend"
	backendBindingPrefix   = "kube-bind-backend-"
	defaultTimeout         = 60 * time.Second
	rbacPropagationTimeout = 10 * time.Second
)

// Provisioner sets consumers up on the provider cluster.
type Provisioner struct {
	cfg      Config
	catalog  *Catalog
	client   kubernetes.Interface
	dynamic  dynamic.Interface
	endpoint endpoint

	userMu sync.Mutex
	user   string // the backend's own user name, found once

	// capRefusals counts new clusters refused by the user's cap.
	capRefusals atomic.Int64
}

// NewProvisioner checks the configuration and reads the CA files. It does
// not contact the cluster.
func NewProvisioner(rc *rest.Config, catalog *Catalog, cfg Config) (*Provisioner, error) {
	if err := ValidatePrefix(cfg.NamespacePrefix); err != nil {
		return nil, err
	}
	if cfg.ProviderPrettyName == "" {
		return nil, fmt.Errorf("provider pretty name is required")
	}
	if catalog == nil {
		return nil, fmt.Errorf("a catalog is required")
	}
	if cfg.TokenLifetime == 0 {
		cfg.TokenLifetime = DefaultTokenLifetime
	}
	if cfg.TokenLifetime < MinTokenLifetime {
		return nil, fmt.Errorf("token lifetime %s: the API server's minimum is %s", cfg.TokenLifetime, MinTokenLifetime)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.MaxClustersPerUser == 0 {
		cfg.MaxClustersPerUser = DefaultMaxClustersPerUser
	}
	if err := ValidateMaxClustersPerUser(cfg.MaxClustersPerUser); err != nil {
		return nil, err
	}
	if cfg.Quota == (Quota{}) {
		cfg.Quota = DefaultQuota()
	}
	if err := cfg.Quota.Validate(); err != nil {
		return nil, err
	}
	ep, err := resolveEndpoint(cfg, rc)
	if err != nil {
		return nil, err
	}
	return (&Provisioner{cfg: cfg, catalog: catalog, endpoint: ep}).WithClientsOf(rc)
}

// WithClientsOf returns a Provisioner that does the same work through
// clients of rc, a configuration of the same cluster and user with
// another request budget: the provider-side controllers' writes (grants,
// rotations, unbinds) then do not spend the budget of users' binds, nor
// theirs.
func (p *Provisioner) WithClientsOf(rc *rest.Config) (*Provisioner, error) {
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	return &Provisioner{cfg: p.cfg, catalog: p.catalog, endpoint: p.endpoint, client: client, dynamic: dyn}, nil
}

// Namespace is the provider namespace of an identity (whether or not it
// exists), for logs and for operators.
func (p *Provisioner) Namespace(c Consumer, clusterID string) string {
	return namespaceName(p.cfg.NamespacePrefix, c, clusterID)
}

// Result is what a bind yields, whichever protocol generation renders it
// into its BindingResponse (internal/sessions/lifecycle).
type Result struct {
	// Namespace is the consumer's provider namespace (also the namespace
	// of the kubeconfig's current context).
	Namespace string `json:"namespace"`
	// Kubeconfig is the kubeconfig YAML issued to the consumer.
	Kubeconfig []byte `json:"kubeconfig"`
	// ConsumerID is the consumer's identity, "<issuer>/<subject>".
	ConsumerID string `json:"consumerID"`
	// APIs are the selected resources as the catalog resolved them
	// (duplicates dropped, in the order selected).
	APIs []ExportedAPI `json:"apis"`
}

// Provision binds a consumer: it checks every selected resource against
// the catalog before touching the cluster, then makes sure the consumer's
// namespace and everything in it exist, and returns the Result, which the
// caller renders for its protocol generation.
// It is idempotent but for the token: a returning consumer gets the same
// namespace and service account and a new token (the one it replaces is
// retired, see RotateToken). A failure midway leaves objects that the next attempt
// reuses and completes; the result is returned only when all exist.
func (p *Provisioner) Provision(ctx context.Context, c Consumer, clusterID string, resources []Resource) (*Result, error) {
	if err := validateIdentity(c, clusterID); err != nil {
		return nil, err
	}
	apis, err := p.resolve(resources)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	ns, created, err := p.ensureNamespace(ctx, c, clusterID)
	if err != nil {
		return nil, err
	}
	// A namespace made just now binds nothing yet: no need to look.
	if !created {
		if err := p.checkBound(ctx, ns, selected(resources)); err != nil {
			return nil, err
		}
	}
	if err := p.grantBackend(ctx, ns); err != nil {
		return nil, err
	}
	var kubeconfig []byte
	steps := []struct {
		what string
		do   func(context.Context) error
	}{
		// The quota first: the consumer can create nothing before it holds.
		{"applying the consumer's resource quota", func(ctx context.Context) error { return p.applyQuota(ctx, ns) }},
		{"applying service account", func(ctx context.Context) error { return p.applyServiceAccount(ctx, ns) }},
		{"applying consumer role binding", func(ctx context.Context) error { return p.applyConsumerRoleBinding(ctx, ns) }},
		// A new token on every bind: a rebind never hands out a token
		// that is in use elsewhere (docs/binding.md).
		{"issuing a token", func(ctx context.Context) error {
			t, err := p.issueToken(ctx, ns, IssuedByBind, !created)
			kubeconfig = t.Kubeconfig
			return err
		}},
		{"applying ClusterBinding", func(ctx context.Context) error { return p.applyClusterBinding(ctx, ns, c) }},
	}
	for _, s := range steps {
		if err := retryForbidden(ctx, func() error { return s.do(ctx) }); err != nil {
			return nil, fmt.Errorf("binding in provider namespace %s: %s: %w", ns, s.what, err)
		}
	}
	return &Result{Namespace: ns, Kubeconfig: kubeconfig, ConsumerID: c.ID(), APIs: apis}, nil
}

// resolve checks the selection against the catalog, dropping duplicates
// and keeping the order.
func (p *Provisioner) resolve(resources []Resource) ([]ExportedAPI, error) {
	if len(resources) == 0 {
		return nil, ErrNoResources
	}
	var apis []ExportedAPI
	for _, r := range selected(resources) {
		api, ok := p.catalog.Lookup(r.Group, r.Resource)
		if !ok {
			return nil, &NotExportedError{Group: r.Group, Resource: r.Resource}
		}
		apis = append(apis, api)
	}
	return apis, nil
}

// selected is resources with each resource kept once, the first time it
// is named, in order.
func selected(resources []Resource) []Resource {
	seen := map[Resource]bool{}
	var out []Resource
	for _, r := range resources {
		key := Resource{Group: r.Group, Resource: r.Resource}
		if !seen[key] {
			seen[key] = true
			out = append(out, r)
		}
	}
	return out
}

// ensureNamespace finds the identity's namespace, or creates it. A
// returning identity's namespace is among the user's, which are listed
// for the cap anyway. The name is derived from the identity, so
// concurrent binds race on one Create and the API server lets exactly one
// win; the others read it back and check that it really is this
// identity's. A new namespace must fit under the user's cap (checked
// here, held by holdCap); an existing one is never refused by it.
// created says whether this call made the namespace (nothing is in it yet).
func (p *Provisioner) ensureNamespace(ctx context.Context, c Consumer, clusterID string) (name string, created bool, err error) {
	name = p.Namespace(c, clusterID)
	labelled, err := p.userNamespaces(ctx, c, false)
	if err != nil {
		return "", false, err
	}
	if i := slices.IndexFunc(labelled, func(ns corev1.Namespace) bool { return ns.Name == name }); i >= 0 {
		return name, false, checkExisting(&labelled[i], c, clusterID)
	}
	older, err := p.userNamespaces(ctx, c, true)
	if err != nil {
		return "", false, err
	}
	if i := slices.IndexFunc(older, func(ns corev1.Namespace) bool { return ns.Name == name }); i >= 0 {
		return name, false, checkExisting(&older[i], c, clusterID)
	}
	if have := live(labelled) + live(older); have >= p.cfg.MaxClustersPerUser {
		p.capRefusals.Add(1)
		return "", false, &ClusterCapError{Cap: p.cfg.MaxClustersPerUser, Have: have}
	}
	want := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			LabelConsumerHash: identityHash(c, clusterID),
			LabelConsumerUser: userHash(c),
			LabelManagedBy:    managedByValue,
		},
		Annotations: map[string]string{
			AnnotationIssuer:  c.Issuer,
			AnnotationSubject: c.Subject,
			AnnotationCluster: clusterID,
		},
	}}
	if c.Proof == ProofIssued {
		want.Annotations[AnnotationClusterIssued] = "true"
	}
	made, err := p.client.CoreV1().Namespaces().Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
	if err == nil {
		return name, true, p.holdCap(ctx, c, made, live(older))
	}
	if !apierrors.IsAlreadyExists(err) {
		return "", false, fmt.Errorf("creating provider namespace %s: %w", name, err)
	}
	existing, err := p.client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", false, fmt.Errorf("reading provider namespace %s: %w", name, err)
	}
	return name, false, checkExisting(existing, c, clusterID)
}

// checkExisting says whether the existing namespace ns of the identity's
// name may be bound again by c.
func checkExisting(ns *corev1.Namespace, c Consumer, clusterID string) error {
	if !sameIdentity(ns, c, clusterID) {
		return fmt.Errorf("%w: namespace %s", ErrIdentityConflict, ns.Name)
	}
	if ns.Annotations[AnnotationClusterIssued] == "true" && c.Proof == ProofToken {
		return fmt.Errorf("%w: namespace %s", ErrClusterNotProven, ns.Name)
	}
	if ns.DeletionTimestamp != nil {
		return fmt.Errorf("%w: namespace %s; bind again once it is gone", ErrNamespaceTerminating, ns.Name)
	}
	if IsRevoked(ns.Labels) {
		return fmt.Errorf("%w: namespace %s was revoked by the provider (label %s) and is about to be removed",
			ErrNamespaceTerminating, ns.Name, LabelRevoked)
	}
	return nil
}

// IsConsumerNamespace says whether ns is a provider namespace Provision
// made for a consumer: labelled as the backend's and carrying an identity.
// Namespaces made for APIServiceNamespaces are not.
func IsConsumerNamespace(ns *corev1.Namespace) bool {
	a := ns.Annotations
	return ns.Labels[LabelManagedBy] == managedByValue && ns.Labels[LabelConsumerNamespace] == "" &&
		a[AnnotationIssuer] != "" && a[AnnotationSubject] != "" && a[AnnotationCluster] != ""
}

func sameIdentity(ns *corev1.Namespace, c Consumer, clusterID string) bool {
	a := ns.Annotations
	return a[AnnotationIssuer] == c.Issuer && a[AnnotationSubject] == c.Subject && a[AnnotationCluster] == clusterID
}

// backendUser finds, once, the user name the backend authenticates as.
func (p *Provisioner) backendUser(ctx context.Context) (string, error) {
	p.userMu.Lock()
	defer p.userMu.Unlock()
	if p.user != "" {
		return p.user, nil
	}
	r, err := p.client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("finding the backend's own user name: %w", err)
	}
	if r.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("finding the backend's own user name: the API server returned none")
	}
	p.user = r.Status.UserInfo.Username
	return p.user, nil
}

// GrantBackend gives the backend its namespace role in ns (a namespace the
// backend made), as Provision does in a consumer namespace; the
// controllers in internal/binding/controllers/exportrequests use it in the namespaces they make.
func (p *Provisioner) GrantBackend(ctx context.Context, ns string) error {
	return p.grantBackend(ctx, ns)
}

// grantBackend binds BackendNamespaceClusterRole to the backend in the
// consumer's namespace, so that it needs no cluster-wide rights on
// secrets, service accounts or ClusterBindings. The binding's name carries
// a hash of the backend's user name: it is only ever created, never
// changed, which needs nothing but cluster-wide "create rolebindings".
func (p *Provisioner) grantBackend(ctx context.Context, ns string) error {
	user, err := p.backendUser(ctx)
	if err != nil {
		return fmt.Errorf("binding in provider namespace %s: %w", ns, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name:   backendBindingPrefix + hashEncoding.EncodeToString(sha256Sum(user))[:10],
			Labels: map[string]string{LabelManagedBy: managedByValue},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: BackendNamespaceClusterRole},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	_, err = p.client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding in provider namespace %s: granting the backend its namespace role: %w", ns, err)
	}
	return nil
}

func (p *Provisioner) applyServiceAccount(ctx context.Context, ns string) error {
	ac := corev1ac.ServiceAccount(ServiceAccountName, ns).WithLabels(map[string]string{LabelManagedBy: managedByValue})
	_, err := p.client.CoreV1().ServiceAccounts(ns).Apply(ctx, ac, applyOptions)
	return err
}

func (p *Provisioner) applyConsumerRoleBinding(ctx context.Context, ns string) error {
	ac := rbacv1ac.RoleBinding(ConsumerRoleBinding, ns).
		WithLabels(map[string]string{LabelManagedBy: managedByValue}).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(ConsumerClusterRole)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(ServiceAccountName).WithNamespace(ns))
	_, err := p.client.RbacV1().RoleBindings(ns).Apply(ctx, ac, applyOptions)
	return err
}

func (p *Provisioner) applyClusterBinding(ctx context.Context, ns string, c Consumer) error {
	now := formatTime(p.now())
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kubeBindGroup + "/v1alpha1",
		"kind":       "ClusterBinding",
		"metadata": map[string]any{
			"name":      ClusterBindingName,
			"namespace": ns,
			"labels":    map[string]any{LabelManagedBy: managedByValue},
			"annotations": map[string]any{
				// The last step: the binding is complete (garbage collection).
				AnnotationProvisionedAt: now,
				// A user's bind starts the binding's lifetime anew, and
				// says whom the allow-list re-check judges.
				AnnotationBoundAt: now,
				AnnotationBoundBy: boundBy(c).Encode(),
			},
		},
		"spec": map[string]any{
			"kubeconfigSecretRef": map[string]any{"name": KubeconfigSecretName, "key": KubeconfigSecretKey},
			"providerPrettyName":  p.cfg.ProviderPrettyName,
		},
	}}
	_, err := p.dynamic.Resource(kbresources.ClusterBindings).Namespace(ns).Apply(ctx, ClusterBindingName, obj, applyOptions)
	return err
}

// Unbind removes a consumer: it revokes the issued token (deleting the
// token Secret and the service account), then deletes the provider
// namespace and so all it holds (RBAC, ClusterBinding, every export).
// Nothing cluster-scoped is made per consumer. It refuses to delete a
// namespace that belongs to another identity.
func (p *Provisioner) Unbind(ctx context.Context, c Consumer, clusterID string) error {
	if err := validateIdentity(c, clusterID); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	return p.unbind(ctx, p.Namespace(c, clusterID), func(have *corev1.Namespace) error {
		if !sameIdentity(have, c, clusterID) {
			return fmt.Errorf("%w: namespace %s", ErrIdentityConflict, have.Name)
		}
		return nil
	})
}

// UnbindNamespace removes the consumer of provider namespace name, as
// Unbind does, for the controllers that find namespaces rather than
// identities (revocation, garbage collection). It refuses a namespace that
// is not a consumer namespace (IsConsumerNamespace) or, when uid is given,
// not the one with that UID (a namespace made again since).
func (p *Provisioner) UnbindNamespace(ctx context.Context, name string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	return p.unbind(ctx, name, func(have *corev1.Namespace) error {
		if !IsConsumerNamespace(have) {
			return fmt.Errorf("%w: namespace %s is not a consumer namespace of this backend", ErrIdentityConflict, name)
		}
		if uid != "" && have.UID != uid {
			return fmt.Errorf("%w: namespace %s was made again (UID %s, not %s)", ErrNotBound, name, have.UID, uid)
		}
		return nil
	})
}

func (p *Provisioner) unbind(ctx context.Context, name string, check func(*corev1.Namespace) error) error {
	have, err := p.client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: no namespace %s", ErrNotBound, name)
	}
	if err != nil {
		return fmt.Errorf("reading provider namespace %s: %w", name, err)
	}
	if err := check(have); err != nil {
		return err
	}
	// A namespace already being deleted (by the provider, or an earlier
	// Unbind) refuses new objects, so the backend cannot grant itself the
	// rights to revoke there, and deleting it again is refused: what is
	// left is the namespaces made for it.
	if have.DeletionTimestamp == nil {
		if err := p.revoke(ctx, name); err != nil {
			return err
		}
		err = p.client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &have.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting provider namespace %s: %w", name, err)
		}
	}
	return p.deleteAPIServiceNamespaces(ctx, name)
}

// deleteAPIServiceNamespaces deletes the namespaces made for the
// consumer's APIServiceNamespaces (internal/binding/controllers/exportrequests labels them with the
// consumer namespace). The controllers would remove them too, but Unbind
// does not depend on them running.
func (p *Provisioner) deleteAPIServiceNamespaces(ctx context.Context, consumerNS string) error {
	list, err := p.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{
		LabelSelector: LabelManagedBy + "=" + managedByValue + "," + LabelConsumerNamespace + "=" + consumerNS,
	})
	if err != nil {
		return fmt.Errorf("listing the namespaces of provider namespace %s: %w", consumerNS, err)
	}
	for _, ns := range list.Items {
		if ns.DeletionTimestamp != nil {
			continue
		}
		err := p.client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ns.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting namespace %s of provider namespace %s: %w", ns.Name, consumerNS, err)
		}
	}
	return nil
}

// revoke deletes the service account and the token Secrets first, so the
// issued kubeconfigs stop working at once rather than whenever the
// namespace controller gets to them.
func (p *Provisioner) revoke(ctx context.Context, ns string) error {
	if err := p.grantBackend(ctx, ns); err != nil {
		return err
	}
	del := func(what string, fn func() error) error {
		err := retryForbidden(ctx, fn)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("unbinding provider namespace %s: deleting %s: %w", ns, what, err)
		}
		return nil
	}
	// The service account first: every token of it dies with it.
	if err := del("service account", func() error {
		return p.client.CoreV1().ServiceAccounts(ns).Delete(ctx, ServiceAccountName, metav1.DeleteOptions{})
	}); err != nil {
		return err
	}
	var tokens *corev1.SecretList
	if err := del("token secrets", func() (err error) {
		tokens, err = p.client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelCredential + "=" + CredentialToken})
		return err
	}); err != nil {
		return err
	}
	for _, t := range tokens.Items {
		if err := del("token secret "+t.Name, func() error {
			return p.client.CoreV1().Secrets(ns).Delete(ctx, t.Name, metav1.DeleteOptions{})
		}); err != nil {
			return err
		}
	}
	return del("legacy token secret", func() error {
		return p.client.CoreV1().Secrets(ns).Delete(ctx, TokenSecretName, metav1.DeleteOptions{})
	})
}

var applyOptions = metav1.ApplyOptions{FieldManager: fieldManager, Force: true}

// retryForbidden retries fn while it is forbidden, for a short while: the
// API server's RBAC cache learns of a just-created RoleBinding with a delay.
func retryForbidden(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(rbacPropagationTimeout)
	delay := 10 * time.Millisecond
	for {
		err := fn()
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
