package credentials

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// Issuer replaces the token of a provider namespace (implemented by
// *binding.Provisioner): kubeconfig is the kubeconfig Secret as the
// controller's look has just read it.
type Issuer interface {
	RotateToken(ctx context.Context, ns string, kubeconfig *corev1.Secret) (binding.IssuedToken, error)
}

// Config configures the controller.
type Config struct {
	Policy Policy
	Issuer Issuer
	// NamespacePrefix: only ClusterBindings in namespaces with this prefix
	// (--namespace-prefix) are the backend's.
	NamespacePrefix string
	// Allowed says whether the allow-list still admits the identity that
	// bound (nil: everybody). It is asked on every reconcile, so on start
	// and at least hourly for every binding.
	Allowed func(binding.BoundBy) bool
	Logger  *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// fieldManager owns the CredentialsValid condition (server-side apply), and
// nothing else of the ClusterBinding's status.
const fieldManager = "kube-bind-backend-credentials"

// Controller rotates and revokes the tokens of every consumer namespace;
// Setup adds it to a leadership term's manager.
type Controller struct {
	cfg Config
	log *slog.Logger
	// quiet holds the namespaces whose last look found that a heartbeat
	// alone changes nothing (HeartbeatMatters false).
	quiet sync.Map
}

// New checks cfg; it does not contact the cluster.
func New(cfg Config) (*Controller, error) {
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
	return &Controller{cfg: cfg, log: cfg.Logger}, nil
}

// run is one leadership term's controller: the term's cache and clients.
type run struct {
	*Controller
	cache client.Reader
	kube  kubernetes.Interface
	dyn   dynamic.Interface
	// looked holds the namespaces this term has looked at: a term's first
	// look may trust the record of an earlier one (AnnotationSettled).
	looked sync.Map
}

// Setup adds the controller to m: a reconcile per consumer namespace on
// every change of its ClusterBinding (but heartbeats and its own
// condition where they change nothing, isNoNews) and when Decide asks to
// look again. ClusterBindings and namespaces are read from m's cache;
// Secrets, which the backend may not read cluster-wide, with one list of
// the namespace per look.
func (c *Controller) Setup(m *kbmanager.Manager) error {
	r := &run{Controller: c, cache: m.GetCache(), kube: m.Kube, dyn: m.Dynamic}
	toNamespace := func(_ context.Context, cb client.Object) []reconcile.Request {
		if cb.GetName() != binding.ClusterBindingName || !strings.HasPrefix(cb.GetNamespace(), c.cfg.NamespacePrefix) {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(cb)}}
	}
	news := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !c.isNoNews(e.ObjectOld, e.ObjectNew)
		},
	}
	bindings := kbmanager.WatchKind(m, kbmanager.ClusterBinding, toNamespace, news)
	c.log.Info("credentials controller: set up", "lifetime", c.cfg.Policy.Lifetime, "rotationPoint", c.cfg.Policy.RotationPoint,
		"overlap", c.cfg.Policy.Overlap, "bindingLifetime", c.cfg.Policy.BindingLifetime, "allowListRecheck", c.cfg.Allowed != nil)
	return m.AddController("credentials", workers, r.reconcile, bindings)
}

// isNoNews says whether the update from old to cb is only a konnector
// heartbeat, or this controller's own CredentialsValid condition, in a
// namespace where heartbeats change nothing; the look the last decision
// scheduled still comes.
func (c *Controller) isNoNews(old, cb client.Object) bool {
	if q, ok := c.quiet.Load(cb.GetNamespace()); !ok || !q.(bool) {
		return false
	}
	prev, err := kbmanager.Expand(old)
	if err != nil {
		return false
	}
	now, err := kbmanager.Expand(cb)
	if err != nil {
		return false
	}
	strip := func(u *unstructured.Unstructured) map[string]any {
		o := u.Object
		unstructured.RemoveNestedField(o, "status", "lastHeartbeatTime")
		unstructured.RemoveNestedField(o, "metadata", "resourceVersion")
		unstructured.RemoveNestedField(o, "metadata", "annotations", AnnotationSettled)
		if conds, ok, _ := unstructured.NestedSlice(o, "status", "conditions"); ok {
			others := conds[:0]
			for _, cond := range conds {
				if m, _ := cond.(map[string]any); m["type"] != ConditionType {
					others = append(others, cond)
				}
			}
			_ = unstructured.SetNestedSlice(o, others, "status", "conditions")
			if len(others) == 0 {
				unstructured.RemoveNestedField(o, "status", "conditions")
			}
		}
		// A status that had nothing but these is no status.
		if status, ok := o["status"].(map[string]any); ok && len(status) == 0 {
			delete(o, "status")
		}
		return o
	}
	return equality.Semantic.DeepEqual(strip(prev), strip(now))
}

// workers is how many namespaces are looked at at once. Every konnector
// heartbeat that can change the decision wakes its namespace, and a look
// lists its Secrets; a rotation's look makes five requests one after
// another (list, token Secret, TokenRequest, kubeconfig, retire), about
// half a second on a busy API server. With fewer workers, rotating
// thousands of credentials waits on those round trips instead of on the
// shared request budget (kbmanager.QPS), which is the limit.
const workers = 16

// reconcile observes one namespace, decides and acts; it returns when to
// look again.
func (r *run) reconcile(ctx context.Context, req reconcile.Request) (time.Duration, error) {
	ns := req.Namespace
	cb, err := kbmanager.Get(ctx, r.cache, kbmanager.ClusterBinding, req.NamespacedName)
	if err != nil {
		r.quiet.Delete(ns)
		r.looked.Delete(ns)
		return 0, client.IgnoreNotFound(err)
	}
	if _, again := r.looked.LoadOrStore(ns, true); !again && r.allowed(ns, cb) {
		if wait, ok := settledWait(cb, r.cfg.Now()); ok {
			r.quiet.Store(ns, true)
			return wait, nil
		}
	}
	state, kubeconfig, err := r.Observe(ctx, ns, cb)
	if err != nil {
		r.quiet.Delete(ns)
		return 0, err
	}
	now := r.cfg.Now()
	d := Decide(now, state, r.cfg.Policy)
	// A look that acts looks again at once; until then heartbeats count.
	quiet := !HeartbeatMatters(state) && !d.Rotate && len(d.MarkRetired) == 0 && len(d.Revoke) == 0
	r.quiet.Store(ns, quiet)
	if err := r.act(ctx, ns, cb, kubeconfig, d, now); err != nil {
		return 0, err
	}
	if quiet && !d.RecordBoundAt && d.Condition != nil {
		if err := r.recordSettled(ctx, cb, d); err != nil {
			return 0, err
		}
	}
	return d.RequeueAfter, nil
}

// Observe reads the state of provider namespace ns: the kubeconfig
// Secret's current token, the other token Secrets, and the heartbeat of
// the ClusterBinding cb. It returns the kubeconfig Secret as read too
// (nil: none), which a rotation replaces.
func (r *run) Observe(ctx context.Context, ns string, cb *unstructured.Unstructured) (State, *corev1.Secret, error) {
	var s State
	if hb, _, _ := unstructured.NestedString(cb.Object, "status", "lastHeartbeatTime"); hb != "" {
		s.LastHeartbeat, _ = time.Parse(time.RFC3339, hb)
	}
	s.RotationRequested = parseTime(cb.GetAnnotations()[AnnotationRotate])
	s.BoundAt = parseTime(cb.GetAnnotations()[binding.AnnotationBoundAt])
	s.NotAllowed = !r.allowed(ns, cb)
	// One read of every Secret in ns: the kubeconfig Secret, the token
	// Secrets and a legacy token Secret (which a previous version may not
	// have labelled), and nothing else the backend would know of, as the
	// consumer creates no Secrets.
	all, err := r.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return s, nil, err
	}
	var kc, legacy *corev1.Secret
	var tokens []*corev1.Secret
	for i := range all.Items {
		sec := &all.Items[i]
		switch {
		case sec.Name == binding.KubeconfigSecretName:
			kc = sec
		case sec.Name == binding.TokenSecretName:
			legacy = sec
		case sec.Labels[binding.LabelCredential] == binding.CredentialToken:
			tokens = append(tokens, sec)
		}
	}
	if kc == nil {
		return s, nil, nil
	}

	currentName := kc.Annotations[binding.AnnotationTokenSecret]
	cur := Token{Secret: currentName, IssuedAt: parseTime(kc.Annotations[binding.AnnotationIssuedAt]), ExpiresAt: parseTime(kc.Annotations[binding.AnnotationExpiresAt])}
	if currentName == "" {
		cur = Token{Secret: binding.TokenSecretName, Legacy: true}
		s.CurrentRevoked = legacy == nil
	} else {
		s.CurrentRevoked = true
	}
	for _, sec := range tokens {
		t := tokenOf(sec)
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
	return s, kc, nil
}

// allowed says whether the allow-list admits the user who bound, as
// recorded on cb.
func (r *run) allowed(ns string, cb *unstructured.Unstructured) bool {
	raw, ok := cb.GetAnnotations()[binding.AnnotationBoundBy]
	if !ok || r.cfg.Allowed == nil {
		return true
	}
	who, err := binding.ParseBoundBy(raw)
	if err != nil {
		// Only the backend and the provider's admins write it: judge
		// an unreadable record as nobody.
		r.log.Warn("credentials: unreadable record of who bound", "namespace", ns, "error", err)
	}
	return r.cfg.Allowed(who)
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

// act carries a decision out; kubeconfig is the kubeconfig Secret as the
// look read it.
func (r *run) act(ctx context.Context, ns string, cb *unstructured.Unstructured, kubeconfig *corev1.Secret, d Decision, now time.Time) error {
	secrets := r.kube.CoreV1().Secrets(ns)
	for _, name := range d.MarkRetired {
		err := binding.MarkRetired(ctx, secrets, name, map[string]string{binding.AnnotationRetiredAt: now.UTC().Format(time.RFC3339)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("marking token Secret %s/%s retired: %w", ns, name, err)
		}
	}
	revokeAll := d.Condition != nil && (d.Condition.Reason == ReasonBindingExpired || d.Condition.Reason == ReasonUserNotAllowed)
	for _, name := range d.Revoke {
		err := secrets.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("revoking token Secret %s/%s: %w", ns, name, err)
		}
		if revokeAll {
			r.log.Info("credentials: revoked a token of an ended binding", "namespace", ns, "secret", name, "reason", d.Condition.Reason)
		} else {
			r.log.Info("credentials: revoked a replaced token", "namespace", ns, "secret", name)
		}
	}
	if d.RecordBoundAt {
		if err := r.recordBoundAt(ctx, cb, now); err != nil {
			return err
		}
	}
	if d.Rotate {
		t, err := r.cfg.Issuer.RotateToken(ctx, ns, kubeconfig)
		if err != nil {
			return fmt.Errorf("rotating the token of %s: %w", ns, err)
		}
		r.log.Info("credentials: rotated the token", "namespace", ns, "secret", t.Secret, "expiresAt", t.ExpiresAt)
	}
	if d.Condition != nil {
		return r.report(ctx, cb, *d.Condition, now)
	}
	return nil
}

// recordBoundAt starts the lifetime of a binding made before it was
// recorded, and records its identity from its namespace, so that the
// allow-list judges it by subject.
func (r *run) recordBoundAt(ctx context.Context, cb *unstructured.Unstructured, now time.Time) error {
	ann := map[string]any{binding.AnnotationBoundAt: now.UTC().Format(time.RFC3339)}
	if _, ok := cb.GetAnnotations()[binding.AnnotationBoundBy]; !ok {
		ns := &corev1.Namespace{}
		if err := r.cache.Get(ctx, client.ObjectKey{Name: cb.GetNamespace()}, ns); err != nil {
			return fmt.Errorf("reading namespace %s for the record of who bound: %w", cb.GetNamespace(), err)
		}
		who := binding.BoundBy{Issuer: ns.Annotations[binding.AnnotationIssuer], Subject: ns.Annotations[binding.AnnotationSubject]}
		ann[binding.AnnotationBoundBy] = who.Encode()
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	_, err = r.dyn.Resource(kbresources.ClusterBindings).Namespace(cb.GetNamespace()).Patch(ctx, cb.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("recording the start of the lifetime of %s: %w", cb.GetNamespace(), err)
	}
	r.log.Info("credentials: a binding made before lifetimes were recorded starts its lifetime now", "namespace", cb.GetNamespace())
	return nil
}

// report sets the CredentialsValid condition when it changed, by
// server-side apply of that one list entry (conditions are a map list
// keyed by type), so the konnector's conditions stay as they are.
func (r *run) report(ctx context.Context, cb *unstructured.Unstructured, cond Condition, now time.Time) error {
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
	_, err := r.dyn.Resource(kbresources.ClusterBindings).Namespace(cb.GetNamespace()).ApplyStatus(ctx, cb.GetName(), apply,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("reporting %s on %s: %w", ConditionType, cb.GetNamespace(), err)
	}
	if cond.Status != "True" {
		r.log.Warn("credentials: "+cond.Message, "namespace", cb.GetNamespace(), "reason", cond.Reason)
	}
	return nil
}
