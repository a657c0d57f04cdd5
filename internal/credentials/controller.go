package credentials

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/kbresources"
	"github.com/kbprovider/backend/internal/workloop"
)

// Issuer issues a new token into a provider namespace (implemented by
// *binding.Provisioner).
type Issuer interface {
	IssueToken(ctx context.Context, ns, issuedBy string) (binding.IssuedToken, error)
}

// Config configures the controller.
type Config struct {
	Policy Policy
	Issuer Issuer
	// NamespacePrefix: only ClusterBindings in namespaces with this prefix
	// (--namespace-prefix) are the backend's.
	NamespacePrefix string
	Logger          *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// fieldManager owns the CredentialsValid condition (server-side apply), and
// nothing else of the ClusterBinding's status.
const fieldManager = "kube-bind-backend-credentials"

// Controller rotates and revokes the tokens of every consumer namespace.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

// New checks cfg; it does not contact the cluster.
func New(rc *rest.Config, cfg Config) (*Controller, error) {
	p := cfg.Policy
	switch {
	case cfg.Issuer == nil:
		return nil, errors.New("credentials: an Issuer is required")
	case len(p.Validate()) > 0:
		return nil, fmt.Errorf("credentials: invalid policy: %w", errors.Join(p.Validate()...))
	case cfg.NamespacePrefix == "":
		return nil, errors.New("credentials: a namespace prefix is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, log: cfg.Logger, kube: kube, dyn: dyn}, nil
}

// Run watches ClusterBindings (their heartbeats) and reconciles each
// consumer namespace on every change and when Decide asks to look again,
// until ctx ends. It returns only when ctx ends or the cache cannot start.
func (c *Controller) Run(ctx context.Context) error {
	factory := dynamicinformer.NewDynamicSharedInformerFactory(c.dyn, 0)
	informer := factory.ForResource(kbresources.ClusterBindings).Informer()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok && strings.HasPrefix(u.GetNamespace(), c.cfg.NamespacePrefix) {
			queue.Add(u.GetNamespace())
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer queue.ShutDown()
	wg.Add(1)
	go func() { defer wg.Done(); informer.Run(ctx.Done()) }()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return ctx.Err()
	}
	c.log.Info("credentials controller: running", "lifetime", c.cfg.Policy.Lifetime, "rotationPoint", c.cfg.Policy.RotationPoint, "overlap", c.cfg.Policy.Overlap)
	store := informer.GetStore()
	workloop.Run(ctx, queue, 1, func(ctx context.Context, ns string) (time.Duration, error) {
		return c.reconcile(ctx, ns, store)
	}, c.log, "credentials")
	c.log.Info("credentials controller: stopped")
	return nil
}

// reconcile observes one namespace, decides and acts; it returns when to
// look again.
func (c *Controller) reconcile(ctx context.Context, ns string, store cache.Store) (time.Duration, error) {
	obj, exists, err := store.GetByKey(ns + "/" + binding.ClusterBindingName)
	if err != nil || !exists {
		return 0, err
	}
	cb := obj.(*unstructured.Unstructured)
	state, err := c.Observe(ctx, ns, cb)
	if err != nil {
		return 0, err
	}
	now := c.cfg.Now()
	d := Decide(now, state, c.cfg.Policy)
	if err := c.act(ctx, ns, cb, d, now); err != nil {
		return 0, err
	}
	return d.RequeueAfter, nil
}

// Observe reads the state of provider namespace ns: the kubeconfig
// Secret's current token, the other token Secrets, and the heartbeat of
// the ClusterBinding cb.
func (c *Controller) Observe(ctx context.Context, ns string, cb *unstructured.Unstructured) (State, error) {
	var s State
	if hb, _, _ := unstructured.NestedString(cb.Object, "status", "lastHeartbeatTime"); hb != "" {
		s.LastHeartbeat, _ = time.Parse(time.RFC3339, hb)
	}
	s.RotationRequested = parseTime(cb.GetAnnotations()[AnnotationRotate])
	secrets := c.kube.CoreV1().Secrets(ns)
	kc, err := secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: binding.LabelCredential + "=" + binding.CredentialToken})
	if err != nil {
		return s, err
	}
	legacy, err := secrets.Get(ctx, binding.TokenSecretName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		legacy = nil
	case err != nil:
		return s, err
	}

	currentName := kc.Annotations[binding.AnnotationTokenSecret]
	cur := Token{Secret: currentName, IssuedAt: parseTime(kc.Annotations[binding.AnnotationIssuedAt]), ExpiresAt: parseTime(kc.Annotations[binding.AnnotationExpiresAt])}
	if currentName == "" {
		cur = Token{Secret: binding.TokenSecretName, Legacy: true}
		s.CurrentRevoked = legacy == nil
	} else {
		s.CurrentRevoked = true
	}
	for _, sec := range list.Items {
		t := tokenOf(&sec)
		if sec.Name == currentName {
			s.CurrentRevoked = false
			cur.IssuedBy = t.IssuedBy
			continue
		}
		s.Retired = append(s.Retired, t)
	}
	if legacy != nil && currentName != "" {
		t := tokenOf(legacy)
		t.Legacy = true
		s.Retired = append(s.Retired, t)
	}
	s.Current = &cur
	return s, nil
}

func tokenOf(sec *corev1.Secret) Token {
	a := sec.Annotations
	return Token{
		Secret:    sec.Name,
		IssuedBy:  a[binding.AnnotationIssuedBy],
		IssuedAt:  parseTime(a[binding.AnnotationIssuedAt]),
		ExpiresAt: parseTime(a[binding.AnnotationExpiresAt]),
		RetiredAt: parseTime(a[binding.AnnotationRetiredAt]),
	}
}

func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339, s)
	return t
}

// act carries a decision out.
func (c *Controller) act(ctx context.Context, ns string, cb *unstructured.Unstructured, d Decision, now time.Time) error {
	secrets := c.kube.CoreV1().Secrets(ns)
	for _, name := range d.MarkRetired {
		err := binding.MarkRetired(ctx, secrets, name, map[string]string{binding.AnnotationRetiredAt: now.UTC().Format(time.RFC3339)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("marking token Secret %s/%s retired: %w", ns, name, err)
		}
	}
	for _, name := range d.Revoke {
		err := secrets.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("revoking token Secret %s/%s: %w", ns, name, err)
		}
		c.log.Info("credentials: revoked a replaced token", "namespace", ns, "secret", name)
	}
	if d.Rotate {
		t, err := c.cfg.Issuer.IssueToken(ctx, ns, binding.IssuedByRotation)
		if err != nil {
			return fmt.Errorf("rotating the token of %s: %w", ns, err)
		}
		c.log.Info("credentials: rotated the token", "namespace", ns, "secret", t.Secret, "expiresAt", t.ExpiresAt)
	}
	if d.Condition != nil {
		return c.report(ctx, cb, *d.Condition, now)
	}
	return nil
}

// report sets the CredentialsValid condition when it changed, by
// server-side apply of that one list entry (conditions are a map list
// keyed by type), so the konnector's conditions stay as they are.
func (c *Controller) report(ctx context.Context, cb *unstructured.Unstructured, cond Condition, now time.Time) error {
	transition := now.UTC().Format(time.RFC3339)
	conditions, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	for _, raw := range conditions {
		have, _ := raw.(map[string]any)
		if have["type"] != ConditionType {
			continue
		}
		if have["status"] == cond.Status && have["reason"] == cond.Reason && have["message"] == cond.Message {
			return nil
		}
		if have["status"] == cond.Status {
			if ts, ok := have["lastTransitionTime"].(string); ok {
				transition = ts
			}
		}
	}
	apply := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1",
		"kind":       "ClusterBinding",
		"metadata":   map[string]any{"name": cb.GetName(), "namespace": cb.GetNamespace()},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": ConditionType, "status": cond.Status, "reason": cond.Reason, "message": cond.Message,
			"lastTransitionTime": transition,
		}}},
	}}
	_, err := c.dyn.Resource(kbresources.ClusterBindings).Namespace(cb.GetNamespace()).ApplyStatus(ctx, cb.GetName(), apply,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("reporting %s on %s: %w", ConditionType, cb.GetNamespace(), err)
	}
	if cond.Status != "True" {
		c.log.Warn("credentials: "+cond.Message, "namespace", cb.GetNamespace(), "reason", cond.Reason)
	}
	return nil
}
