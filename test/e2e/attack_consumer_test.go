package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// bindByPoll binds user by the poll flow without a browser (the identity
// provider's login form and the selection form posted over HTTP, one API
// ticked) and returns the BindingResponse the client receives.
func (e *env) bindByPoll(t *testing.T, user oidcprovider.User) v1alpha1.BindingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, authURL := e.newSession(t)
	type result struct {
		resp v1alpha1.BindingResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := s.Wait(ctx)
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{resp: res.Response}
	}()
	client, form := e.loginToSelection(t, authURL, user)
	if status, body := e.post(t, client, form, nil); status != http.StatusOK {
		t.Fatalf("binding as %s: %d %s", user.Name, status, body)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("the poll of %s's binding: %v", user.Name, r.err)
	}
	return r.resp
}

// consumer is what a bound user holds: clients made from its issued
// kubeconfig, and its provider namespace.
type consumer struct {
	kube kubernetes.Interface
	dyn  dynamic.Interface
	ns   string
}

func (e *env) bindConsumer(t *testing.T, user oidcprovider.User) consumer {
	t.Helper()
	resp := e.bindByPoll(t, user)
	rc, ns := testutil.IssuedConfig(t, resp.Kubeconfig)
	return consumer{kube: kubernetes.NewForConfigOrDie(rc), dyn: dynamic.NewForConfigOrDie(rc), ns: ns}
}

var (
	requestsV1 = kbresources.APIServiceExportRequests
	requestsV2 = kbresources.APIServiceExportRequestsV1alpha2
	exportsV2  = kbresources.APIServiceExportsV1alpha2
	apiNSV2    = kbresources.APIServiceNamespacesV1alpha2
)

// object decodes YAML into an object, failing the test.
func object(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// offerTemplate creates an APIServiceExportTemplate as the provider does
// and removes it when the test ends.
func (e *env) offerTemplate(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	admin := dynamic.NewForConfigOrDie(e.cp.AdminConfig())
	u := object(t, y)
	created, err := admin.Resource(kbresources.APIServiceExportTemplates).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.Resource(kbresources.APIServiceExportTemplates).Delete(context.Background(), u.GetName(), metav1.DeleteOptions{})
	})
	return created
}

// request creates an APIServiceExportRequest as the consumer.
func (c consumer) request(t *testing.T, y string) {
	t.Helper()
	if _, err := c.dyn.Resource(requestsV2).Namespace(c.ns).Create(context.Background(), object(t, y), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a request as the consumer: %v", err)
	}
}

// phase reads a request's phase and message as the consumer.
func (c consumer) phase(name string) (phase, message string) {
	u, err := c.dyn.Resource(requestsV2).Namespace(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
	message, _, _ = unstructured.NestedString(u.Object, "status", "terminalMessage")
	return phase, message
}

func (c consumer) awaitPhase(t *testing.T, name, want string) {
	t.Helper()
	testutil.Await(t, "request "+name+" to be "+want, func() bool { p, _ := c.phase(name); return p == want })
}

// apiNamespace creates an APIServiceNamespace as the consumer and returns
// the provider namespace the backend made for it.
func (c consumer) apiNamespace(t *testing.T, name string) string {
	t.Helper()
	u := object(t, fmt.Sprintf("{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceNamespace, metadata: {name: %q}, spec: {}}", name))
	if _, err := c.dyn.Resource(apiNSV2).Namespace(c.ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating APIServiceNamespace %s: %v", name, err)
	}
	var child string
	testutil.Await(t, "the provider namespace of APIServiceNamespace "+name, func() bool {
		u, err := c.dyn.Resource(apiNSV2).Namespace(c.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			child, _, _ = unstructured.NestedString(u.Object, "status", "namespace")
		}
		return child != ""
	})
	return child
}

// rules reads a Role's rules as the admin; nil when it does not exist.
func (e *env) rules(ns, role string) []rbacv1.PolicyRule {
	r, err := e.kube.RbacV1().Roles(ns).Get(context.Background(), role, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return r.Rules
}

// can asks the API server, as the consumer, whether it may do verb on
// group/resource in ns.
func (c consumer) can(t *testing.T, ns, verb, group, resource string) bool {
	t.Helper()
	r, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: group, Resource: resource}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// privilegedPod tries, as the consumer, the Pod that takes over a node.
func (c consumer) privilegedPod(ns string) error {
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "root"},
		Spec: corev1.PodSpec{
			HostPID: true, HostNetwork: true,
			Containers: []corev1.Container{{Name: "root", Image: "busybox", Command: []string{"chroot", "/host"},
				SecurityContext: &corev1.SecurityContext{Privileged: &yes},
				VolumeMounts:    []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}}},
			Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}},
		},
	}
	_, err := c.kube.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	return err
}

// A template offering MangoDBs with a claim on the Secrets labelled
// app=db, and the request a consumer makes from it.
const (
	claimSecrets  = `{group: "", resource: secrets, selector: {labelSelector: {matchLabels: {app: db}}}}`
	claimConfigs  = `{group: "", resource: configmaps, selector: {labelSelector: {matchLabels: {app: db}}}}`
	claimAnything = `{group: "*", resource: "*", selector: {}}`
)

func templateYAML(name string, claims ...string) string {
	return fmt.Sprintf(`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: %s},
  spec: {resources: [{group: mangodb.com, resource: mangodbs}], permissionClaims: [%s]}}`, name, strings.Join(claims, ", "))
}

func requestYAML(name string, claims ...string) string {
	return fmt.Sprintf(`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportRequest, metadata: {name: %s},
  spec: {resources: [{group: mangodb.com, resource: mangodbs}], permissionClaims: [%s]}}`, name, strings.Join(claims, ", "))
}

// claimVerbs are what konnector v0.8 needs on claimed objects.
var claimVerbs = []string{"get", "list", "watch", "create", "update", "delete"}

func claimRule(resource string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{resource}, Verbs: claimVerbs}
}

// bound binds a consumer and has it request MangoDBs with the Secrets
// claim of a template made for the test; it returns the consumer and the
// provider namespace of its APIServiceNamespace "default".
func (e *env) bound(t *testing.T, user oidcprovider.User, template string, claims ...string) (consumer, string) {
	t.Helper()
	e.offerTemplate(t, templateYAML(template, claims...))
	c := e.bindConsumer(t, user)
	c.request(t, requestYAML("mangodbs.mangodb.com", claims...))
	c.awaitPhase(t, "mangodbs.mangodb.com", "Succeeded")
	child := c.apiNamespace(t, "default")
	want := []rbacv1.PolicyRule{}
	for _, cl := range claims {
		for _, res := range []string{"secrets", "configmaps"} {
			if strings.Contains(cl, "resource: "+res+",") {
				want = append(want, claimRule(res))
			}
		}
	}
	sortRules(want)
	testutil.Await(t, "the claims Role with the template's claims", func() bool {
		return sameRules(e.rules(child, exportrequests.ConsumerClaimsRole), want)
	})
	return c, child
}

// sameRules compares rules, no rule and an empty list alike.
func sameRules(a, b []rbacv1.PolicyRule) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

func sortRules(rules []rbacv1.PolicyRule) {
	for i := range rules {
		for j := i + 1; j < len(rules); j++ {
			if rules[j].Resources[0] < rules[i].Resources[0] {
				rules[i], rules[j] = rules[j], rules[i]
			}
		}
	}
}

// noWildcard fails the test when a Role the backend made in ns holds a
// wildcard or anything beyond what a provider can declare.
func (e *env) noWildcard(t *testing.T, ns string) {
	t.Helper()
	for _, role := range []string{exportrequests.ConsumerClaimsRole, exportrequests.ConsumerExportsRole} {
		for _, r := range e.rules(ns, role) {
			if err := binding.CheckConsumerRule(r, offers.DefaultClaimableResources); err != nil {
				t.Errorf("Role %s/%s holds %s: %v", ns, role, r.String(), err)
			}
		}
	}
}

// The first attack, exactly.
//
// Attacker: a consumer with an ordinary bind merge-patches the
// permissionClaims of its Succeeded request to [{group: "*", resource:
// "*", selector: {}}], then creates an APIServiceNamespace, to get every
// right in the namespace made for it and run a privileged Pod.
// Stopped by: the request's spec is immutable (the CRD refuses the patch
// through both versions); the claims Role is built only from the offer's
// exact claims on claimable resources, so it gains no rule; no Pod.
func TestAttackWildcardClaimsAfterSuccess(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	carol := binder("carol-wildcard-claims-after-success")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{carol}})
	c, child := e.bound(t, carol, "attack-wildcard", claimSecrets)
	before := e.rules(child, exportrequests.ConsumerClaimsRole)

	patch := []byte(`{"spec":{"permissionClaims":[{"group":"*","resource":"*","selector":{}}]}}`)
	for _, gvr := range []schema.GroupVersionResource{requestsV1, requestsV2} {
		_, err := c.dyn.Resource(gvr).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.MergePatchType, patch, metav1.PatchOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec is immutable") {
			t.Errorf("widening the claims through %s: %v, want Invalid saying the spec is immutable", gvr.Version, err)
		}
	}
	second := c.apiNamespace(t, "second")
	// Give the controller every chance to widen the Role: a resync pass of
	// the consumer's namespace (the APIServiceNamespace's own) has run.
	time.Sleep(2 * time.Second)
	for _, ns := range []string{child, second} {
		if got := e.rules(ns, exportrequests.ConsumerClaimsRole); !reflect.DeepEqual(got, before) {
			t.Errorf("claims Role in %s: %v, want %v", ns, got, before)
		}
		e.noWildcard(t, ns)
		if err := c.privilegedPod(ns); !apierrors.IsForbidden(err) {
			t.Errorf("a privileged Pod in %s: %v, want Forbidden", ns, err)
		}
		// What the attacker did next with the wildcard: relabel the
		// namespace for privileged Pods, bind its Role to anybody.
		for _, do := range [][3]string{{"create", "", "pods"}, {"patch", "", "namespaces"}, {"update", "", "namespaces"},
			{"create", "rbac.authorization.k8s.io", "rolebindings"}, {"bind", "rbac.authorization.k8s.io", "roles"},
			{"escalate", "rbac.authorization.k8s.io", "roles"}, {"create", "*", "*"}} {
			if c.can(t, ns, do[0], do[1], do[2]) {
				t.Errorf("the consumer may %s %s.%s in %s", do[0], do[2], do[1], ns)
			}
		}
	}
}

// Attacker: edits spec.resources, spec.parameters, spec.namespaces (and
// schemaUpdatePolicy) of a Succeeded request, through v1alpha1 and
// v1alpha2, with merge and JSON patches and a whole update, to bind what
// it was not offered under a decision already taken.
// Stopped by: the CRD's rule that the whole spec is immutable, in both
// served versions; the export stays as decided.
func TestAttackEditSpecAfterSuccess(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	dave := binder("dave-edit-spec-after-success")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{dave}})
	c := e.bindConsumer(t, dave)
	c.request(t, `{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportRequest, metadata: {name: mangodbs.mangodb.com},
  spec: {resources: [{group: mangodb.com, resource: mangodbs}], parameters: {size: 1}}}`)
	c.awaitPhase(t, "mangodbs.mangodb.com", "Succeeded")
	exportBefore, err := c.dyn.Resource(exportsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patches := map[string]string{
		"resources":          `{"spec":{"resources":[{"group":"internal.example.com","resource":"secretthings"}]}}`,
		"added resources":    `{"spec":{"resources":[{"group":"mangodb.com","resource":"mangodbs"},{"group":"cache.example.com","resource":"redises"}]}}`,
		"parameters":         `{"spec":{"parameters":{"size":1000}}}`,
		"removed parameters": `{"spec":{"parameters":null}}`,
		"namespaces":         `{"spec":{"namespaces":[{"name":"kube-system"}]}}`,
		"schemaUpdatePolicy": `{"spec":{"schemaUpdatePolicy":"Never"}}`,
	}
	for _, gvr := range []schema.GroupVersionResource{requestsV1, requestsV2} {
		for what, p := range patches {
			_, err := c.dyn.Resource(gvr).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.MergePatchType, []byte(p), metav1.PatchOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec is immutable") {
				t.Errorf("changing %s through %s: %v, want Invalid saying the spec is immutable", what, gvr.Version, err)
			}
		}
		_, err := c.dyn.Resource(gvr).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.JSONPatchType,
			[]byte(`[{"op":"add","path":"/spec/namespaces","value":[{"name":"team-x"}]}]`), metav1.PatchOptions{})
		if !apierrors.IsInvalid(err) {
			t.Errorf("a JSON patch of spec.namespaces through %s: %v, want Invalid", gvr.Version, err)
		}
		u, err := c.dyn.Resource(gvr).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{"group": "cache.example.com", "resource": "redises"}}, "spec", "resources")
		if _, err := c.dyn.Resource(gvr).Namespace(c.ns).Update(context.Background(), u, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("an update of spec.resources through %s: %v, want Invalid", gvr.Version, err)
		}
	}
	time.Sleep(time.Second)
	after, err := c.dyn.Resource(exportsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after.Object["spec"], exportBefore.Object["spec"]) {
		t.Errorf("the export changed:\nbefore %v\nafter  %v", exportBefore.Object["spec"], after.Object["spec"])
	}
	if _, err := c.dyn.Resource(apiNSV2).Namespace(c.ns).Get(context.Background(), "kube-system", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an APIServiceNamespace kube-system was made for the refused edit: %v", err)
	}
}

// Attacker: deletes its Succeeded request and creates one of the same
// name asking for a wildcard claim, a Secrets claim with no selector and a
// namespace, hoping the backend carries the old decision over.
// Stopped by: a new request is a new object, Pending, judged by Cover; it
// fails, and the export left from the old request is judged against the
// offers on every pass: the Role keeps only the offer's claim.
func TestAttackRecreateRequestWider(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	carol := binder("carol-recreate-request-wider")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{carol}})
	c, child := e.bound(t, carol, "attack-recreate", claimSecrets)
	before := e.rules(child, exportrequests.ConsumerClaimsRole)
	if err := c.dyn.Resource(requestsV2).Namespace(c.ns).Delete(context.Background(), "mangodbs.mangodb.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the request to be gone", func() bool {
		_, err := c.dyn.Resource(requestsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	c.request(t, `{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportRequest, metadata: {name: mangodbs.mangodb.com},
  spec: {resources: [{group: mangodb.com, resource: mangodbs}], namespaces: [{name: kube-system}],
         permissionClaims: [`+claimAnything+`, {group: "", resource: secrets, selector: {}}]}}`)
	c.awaitPhase(t, "mangodbs.mangodb.com", "Failed")
	if _, msg := c.phase("mangodbs.mangodb.com"); !strings.Contains(msg, "no single offer") {
		t.Errorf("the wider request's message %q does not say no offer holds it", msg)
	}
	time.Sleep(time.Second)
	if got := e.rules(child, exportrequests.ConsumerClaimsRole); !reflect.DeepEqual(got, before) {
		t.Errorf("claims Role after the wider request: %v, want %v", got, before)
	}
	export, err := c.dyn.Resource(exportsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claims, _, _ := unstructured.NestedSlice(export.Object, "spec", "permissionClaims")
	if b, _ := json.Marshal(claims); len(claims) != 1 || strings.Contains(string(b), "*") {
		t.Errorf("the export's claims after the wider request: %s", b)
	}
	if _, err := c.dyn.Resource(apiNSV2).Namespace(c.ns).Get(context.Background(), "kube-system", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an APIServiceNamespace kube-system was made for the refused request: %v", err)
	}
}

// Attacker: writes its request's status (phase Succeeded on a request no
// offer covers) and its export's status; and, should a status ever be
// written for it (by a bug, another controller, a rights change), hopes
// the backend grants whatever a Succeeded request asks for.
// Stopped by: the consumer has no rights on requests' status; the
// backend never reads an export's status; and a Succeeded request is
// judged against today's offers on every pass: here (its status forced
// by the admin) it gets MangoDBs only, no claim, no namespace, and a
// Granted=False condition saying why.
func TestAttackWriteStatus(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	dave := binder("dave-write-status")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{dave}})
	c := e.bindConsumer(t, dave)
	c.request(t, `{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportRequest, metadata: {name: mangodbs.mangodb.com},
  spec: {resources: [{group: mangodb.com, resource: mangodbs}], namespaces: [{name: kube-system}],
         permissionClaims: [`+claimAnything+`, {group: "", resource: secrets, selector: {}}]}}`)
	c.awaitPhase(t, "mangodbs.mangodb.com", "Failed")
	for _, gvr := range []schema.GroupVersionResource{requestsV1, requestsV2} {
		_, err := c.dyn.Resource(gvr).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.MergePatchType,
			[]byte(`{"status":{"phase":"Succeeded"}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) {
			t.Errorf("the consumer writing its request's status through %s: %v, want Forbidden", gvr.Version, err)
		}
	}

	// As if it could: the admin sets the phase.
	admin := dynamic.NewForConfigOrDie(e.cp.AdminConfig())
	if _, err := admin.Resource(requestsV2).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.MergePatchType,
		[]byte(`{"status":{"phase":"Succeeded","terminalMessage":""}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	var reason string
	testutil.Await(t, "the Granted condition of the forced request", func() bool {
		u, err := c.dyn.Resource(requestsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, cond := range conds {
			if m, _ := cond.(map[string]any); m["type"] == exportrequests.ConditionGranted && m["status"] == "False" {
				reason, _ = m["reason"].(string)
				return true
			}
		}
		return false
	})
	if reason != offers.ReasonOfferNarrowed {
		t.Errorf("Granted reason %q, want %s", reason, offers.ReasonOfferNarrowed)
	}
	var export *unstructured.Unstructured
	testutil.Await(t, "the export of the forced request", func() bool {
		var err error
		export, err = c.dyn.Resource(exportsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
		return err == nil
	})
	if claims, found, _ := unstructured.NestedSlice(export.Object, "spec", "permissionClaims"); found {
		t.Errorf("the export of the forced request claims %v", claims)
	}
	child := c.apiNamespace(t, "default")
	time.Sleep(time.Second)
	if got := e.rules(child, exportrequests.ConsumerClaimsRole); len(got) != 0 {
		t.Errorf("claims Role of the forced request: %v, want no rule", got)
	}
	e.noWildcard(t, child)
	if err := c.privilegedPod(child); !apierrors.IsForbidden(err) {
		t.Errorf("a privileged Pod in %s: %v, want Forbidden", child, err)
	}
	if c.can(t, child, "get", "", "secrets") {
		t.Error("the forced request's claim on all Secrets was granted")
	}
	if _, err := c.dyn.Resource(apiNSV2).Namespace(c.ns).Get(context.Background(), "kube-system", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an APIServiceNamespace kube-system was made for the forced request: %v", err)
	}

	// The export's status is the consumer's to write; it moves nothing.
	if _, err := c.dyn.Resource(exportsV2).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.MergePatchType,
		[]byte(`{"spec":{"permissionClaims":[{"group":"*","resource":"*","selector":{}}]},"status":{"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`),
		metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("the consumer writing its export's status: %v", err)
	}
	if _, err := c.dyn.Resource(exportsV2).Namespace(c.ns).Patch(context.Background(), "mangodbs.mangodb.com", types.MergePatchType,
		[]byte(`{"spec":{"permissionClaims":[{"group":"*","resource":"*","selector":{}}]}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the consumer writing its export's spec: %v, want Forbidden", err)
	}
	time.Sleep(time.Second)
	if got := e.rules(child, exportrequests.ConsumerClaimsRole); len(got) != 0 {
		t.Errorf("claims Role after the export's status was written: %v, want no rule", got)
	}
	after, _ := c.dyn.Resource(exportsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
	if claims, found, _ := unstructured.NestedSlice(after.Object, "spec", "permissionClaims"); found {
		t.Errorf("the export's spec took claims through /status: %v", claims)
	}
}

// Attacker: writes the BoundSchemas the backend made for it (a wider
// schema, another group), through the object and through /status, and
// creates one of its own.
// Stopped by: the consumer may only read BoundSchemas and write their
// status; /status keeps the spec; the backend owns and rewrites the spec.
func TestAttackWriteBoundSchemas(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	dave := binder("dave-write-bound-schemas")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{dave}})
	c := e.bindConsumer(t, dave)
	c.request(t, requestYAML("mangodbs.mangodb.com"))
	c.awaitPhase(t, "mangodbs.mangodb.com", "Succeeded")
	bs := kbresources.BoundSchemas
	before, err := c.dyn.Resource(bs).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wider := []byte(`{"spec":{"group":"rbac.authorization.k8s.io","names":{"plural":"roles","kind":"Role"}}}`)
	if _, err := c.dyn.Resource(bs).Namespace(c.ns).Patch(context.Background(), before.GetName(), types.MergePatchType, wider, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the consumer patching a BoundSchema: %v, want Forbidden", err)
	}
	if _, err := c.dyn.Resource(bs).Namespace(c.ns).Patch(context.Background(), before.GetName(), types.MergePatchType, wider, metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("the consumer writing a BoundSchema's status: %v", err)
	}
	own := before.DeepCopy()
	own.SetName("roles.rbac.authorization.k8s.io")
	own.SetResourceVersion("")
	if _, err := c.dyn.Resource(bs).Namespace(c.ns).Create(context.Background(), own, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the consumer creating a BoundSchema: %v, want Forbidden", err)
	}
	if err := c.dyn.Resource(bs).Namespace(c.ns).Delete(context.Background(), before.GetName(), metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the consumer deleting a BoundSchema: %v, want Forbidden", err)
	}
	after, err := c.dyn.Resource(bs).Namespace(c.ns).Get(context.Background(), before.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after.Object["spec"], before.Object["spec"]) {
		t.Error("the BoundSchema's spec changed through /status")
	}
	if got := e.rules(c.ns, exportrequests.ConsumerExportsRole); len(got) != 1 || got[0].APIGroups[0] != "mangodb.com" {
		t.Errorf("exports Role after the BoundSchema writes: %v", got)
	}
}

// Attacker: names APIServiceNamespaces after another consumer's provider
// namespace, after kube-system and after the backend's own prefix, so
// that the backend grants it rights there.
// Stopped by: the namespace made for an APIServiceNamespace is named by a
// hash of the consumer's namespace and the name, with the backend's
// prefix; the Roles go only there. Nothing appears in the named ones.
func TestAttackAPIServiceNamespaceNames(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	bob := binder("bob-apiservicenamespace-names")
	dave := binder("dave-apiservicenamespace-names")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{bob, dave}})
	victim := e.bindConsumer(t, bob)
	victim.request(t, requestYAML("mangodbs.mangodb.com"))
	victim.awaitPhase(t, "mangodbs.mangodb.com", "Succeeded")
	c := e.bindConsumer(t, dave)
	c.request(t, requestYAML("mangodbs.mangodb.com"))
	c.awaitPhase(t, "mangodbs.mangodb.com", "Succeeded")
	for _, name := range []string{victim.ns, "kube-system", "default", namespacePrefix + "x"} {
		child := c.apiNamespace(t, name)
		if child == name || !strings.HasPrefix(child, namespacePrefix) || child != exportrequests.ChildNamespaceName(namespacePrefix, c.ns, name) {
			t.Errorf("APIServiceNamespace %s got provider namespace %s", name, child)
		}
		if c.can(t, name, "get", "", "secrets") || c.can(t, name, "create", "mangodb.com", "mangodbs") {
			t.Errorf("the consumer got rights in %s", name)
		}
		for _, role := range []string{exportrequests.ConsumerClaimsRole, exportrequests.ConsumerExportsRole} {
			rb, err := e.kube.RbacV1().RoleBindings(name).Get(context.Background(), role, metav1.GetOptions{})
			if err == nil && name != victim.ns {
				t.Errorf("RoleBinding %s/%s was made", name, role)
			}
			if err == nil {
				for _, s := range rb.Subjects {
					if s.Namespace == c.ns {
						t.Errorf("RoleBinding %s/%s binds the attacker", name, role)
					}
				}
			}
		}
	}
	if !c.can(t, exportrequests.ChildNamespaceName(namespacePrefix, c.ns, "kube-system"), "create", "mangodb.com", "mangodbs") {
		t.Error("the consumer did not get its bound resource in the namespace made for it (the check above would prove nothing)")
	}
}

// Attacker: rewrites who bound it and when (the kube-bind.io/bound-by and
// bound-at annotations, and labels) on its ClusterBinding through the
// /status it may write, to pass as another user or dodge the garbage
// collection.
// Stopped by: /status keeps everything but the status (metadata
// included); the consumer has no rights on the ClusterBinding itself.
func TestAttackClusterBindingMetadataThroughStatus(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	dave := binder("dave-cluster-binding-metadata-through-status")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{dave}})
	c := e.bindConsumer(t, dave)
	// The backend's own last write (the delivery mark) lands first.
	e.requireDelivered(t, c.ns)
	cbs := kbresources.ClusterBindingsV1alpha2
	before, err := e.kube.CoreV1().Namespaces().Get(context.Background(), c.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin := dynamic.NewForConfigOrDie(e.cp.AdminConfig())
	cb, err := admin.Resource(cbs).Namespace(c.ns).Get(context.Background(), "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const forgedSettled = "2099-01-01T00:00:00Z 00000000000000000000000000000000"
	patch := []byte(`{"metadata":{"annotations":{"kube-bind.io/bound-by":"{\"issuer\":\"x\",\"subject\":\"alice\"}","kube-bind.io/bound-at":"2099-01-01T00:00:00Z",
	  "` + credentials.AnnotationSettled + `":"` + forgedSettled + `"},
	  "labels":{"app.kubernetes.io/managed-by":"someone-else"}},"status":{}}`)
	for _, gvr := range []schema.GroupVersionResource{kbresources.ClusterBindings, cbs} {
		if _, err := c.dyn.Resource(gvr).Namespace(c.ns).Patch(context.Background(), "cluster", types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Errorf("the consumer writing its ClusterBinding's status through %s: %v", gvr.Version, err)
		}
		if _, err := c.dyn.Resource(gvr).Namespace(c.ns).Patch(context.Background(), "cluster", types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the consumer patching its ClusterBinding through %s: %v, want Forbidden", gvr.Version, err)
		}
	}
	after, err := admin.Resource(cbs).Namespace(c.ns).Get(context.Background(), "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The credentials controller records a settled consumer on its own
	// schedule, meanwhile: that annotation is compared on its own.
	if got := after.GetAnnotations()[credentials.AnnotationSettled]; got == forgedSettled {
		t.Errorf("the consumer wrote %s through /status: %q", credentials.AnnotationSettled, got)
	}
	withoutSettled := func(a map[string]string) map[string]string {
		b := maps.Clone(a)
		delete(b, credentials.AnnotationSettled)
		return b
	}
	if !reflect.DeepEqual(withoutSettled(after.GetAnnotations()), withoutSettled(cb.GetAnnotations())) || !reflect.DeepEqual(after.GetLabels(), cb.GetLabels()) {
		t.Errorf("the ClusterBinding's metadata changed through /status:\nbefore %v %v\nafter  %v %v",
			cb.GetLabels(), cb.GetAnnotations(), after.GetLabels(), after.GetAnnotations())
	}
	ns, err := e.kube.CoreV1().Namespaces().Get(context.Background(), c.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ns.Annotations, before.Annotations) || !reflect.DeepEqual(ns.Labels, before.Labels) {
		t.Error("the consumer's namespace metadata changed")
	}
}

// Attacker: asks for a claim whose selector names the backend's own
// Secrets (its kubeconfig and token Secrets in its provider namespace,
// another consumer's, kube-system's), and, bound to a template that claims
// every Secret (selector {}), tries to read Secrets beyond the namespaces
// made for its APIServiceNamespaces.
// Stopped by: Cover compares whole claims, so a selector the offer does
// not hold fails the request; and the claims Role exists only in the
// namespaces made for APIServiceNamespaces, never in a consumer's own
// provider namespace, another's, or a system namespace.
func TestAttackClaimReachesBackendSecrets(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	bob := binder("bob-claim-reaches-backend-secrets")
	carol := binder("carol-claim-reaches-backend-secrets")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{bob, carol}})
	victim := e.bindConsumer(t, bob)
	allSecrets := `{group: "", resource: secrets, selector: {}}`
	c, child := e.bound(t, carol, "attack-all-secrets", allSecrets)
	named := fmt.Sprintf(`{group: "", resource: secrets, selector: {namedResources: [{name: kubeconfig, namespace: %s}, {name: kubeconfig, namespace: %s}, {name: bootstrap-token, namespace: kube-system}]}}`,
		c.ns, victim.ns)
	c.request(t, `{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportRequest, metadata: {name: named},
  spec: {resources: [{group: mangodb.com, resource: mangodbs}], permissionClaims: [`+named+`]}}`)
	c.awaitPhase(t, "named", "Failed")
	if !c.can(t, child, "get", "", "secrets") {
		t.Fatal("the template's claim was not granted in the namespace made for it (the checks below would prove nothing)")
	}
	for _, ns := range []string{victim.ns, "kube-system", "default"} {
		for _, verb := range []string{"get", "list", "create"} {
			if c.can(t, ns, verb, "", "secrets") {
				t.Errorf("the consumer may %s Secrets in %s", verb, ns)
			}
		}
	}
	// Its own provider namespace: reading its own credentials is what the
	// consumer role allows; the claim adds no write there.
	for _, verb := range []string{"create", "update", "delete"} {
		if c.can(t, c.ns, verb, "", "secrets") {
			t.Errorf("the claim lets the consumer %s Secrets in its own provider namespace", verb)
		}
	}
	if r := e.rules(c.ns, exportrequests.ConsumerClaimsRole); r != nil {
		t.Errorf("a claims Role in the consumer's provider namespace: %v", r)
	}
	if c.can(t, "", "list", "", "secrets") {
		t.Error("the consumer may list Secrets cluster-wide")
	}
}

// Attacker: keeps what it was granted after the provider narrows the
// offer (a claim removed from the template) or withdraws it (the template
// deleted), relying on a decision taken once.
// Stopped by: every pass judges decided requests against today's offers
// (a template change queues every consumer): the claims Role and the
// export narrow to what the offers still hold, and the request's Granted
// condition says why. How long that takes is logged.
func TestAttackKeepsWithdrawnOffer(t *testing.T) {
	// Users of its own: what it leaves behind meets no other test.
	carol := binder("carol-keeps-withdrawn-offer")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{carol}})
	c, child := e.bound(t, carol, "attack-narrowed", claimSecrets, claimConfigs)
	admin := dynamic.NewForConfigOrDie(e.cp.AdminConfig())
	templates := admin.Resource(kbresources.APIServiceExportTemplates)

	granted := func() (status, reason string) {
		u, err := c.dyn.Resource(requestsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
		if err != nil {
			return "", ""
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, cond := range conds {
			if m, _ := cond.(map[string]any); m["type"] == exportrequests.ConditionGranted {
				status, _ = m["status"].(string)
				reason, _ = m["reason"].(string)
			}
		}
		return status, reason
	}
	// narrowed waits, polling every 5 ms, until the claims Role holds want,
	// and reports how long that took.
	narrowed := func(what string, want []rbacv1.PolicyRule) time.Duration {
		t.Helper()
		start := time.Now()
		testutil.AwaitWithin(t, 30*time.Second, 5*time.Millisecond, what, func() (bool, error) {
			return sameRules(e.rules(child, exportrequests.ConsumerClaimsRole), want), nil
		})
		took := time.Since(start)
		t.Logf("%s: the claims Role narrowed %v after the template changed", what, took.Round(time.Millisecond))
		return took
	}

	// Narrowed: the ConfigMaps claim is removed from the template.
	tmpl, err := templates.Get(context.Background(), "attack-narrowed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	narrower := object(t, templateYAML("attack-narrowed", claimSecrets))
	_ = unstructured.SetNestedField(tmpl.Object, narrower.Object["spec"], "spec")
	if _, err := templates.Update(context.Background(), tmpl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	narrowed("a claim removed from the template", []rbacv1.PolicyRule{claimRule("secrets")})
	testutil.Await(t, "the Granted condition to say OfferNarrowed", func() bool {
		s, r := granted()
		return s == "False" && r == offers.ReasonOfferNarrowed
	})
	export := func() []any {
		u, err := c.dyn.Resource(exportsV2).Namespace(c.ns).Get(context.Background(), "mangodbs.mangodb.com", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		claims, _, _ := unstructured.NestedSlice(u.Object, "spec", "permissionClaims")
		return claims
	}
	testutil.Await(t, "the export to keep only the Secrets claim", func() bool {
		claims := export()
		return len(claims) == 1 && claims[0].(map[string]any)["resource"] == "secrets"
	})
	// The request's phase is never flipped by the narrowing.
	if p, _ := c.phase("mangodbs.mangodb.com"); p != "Succeeded" {
		t.Errorf("phase after the narrowing: %q, want Succeeded", p)
	}

	// Offered again: the request gets it back, never more than it asked.
	tmpl, err = templates.Get(context.Background(), "attack-narrowed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(tmpl.Object, object(t, templateYAML("attack-narrowed", claimSecrets, claimConfigs)).Object["spec"], "spec")
	if _, err := templates.Update(context.Background(), tmpl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	narrowed("the claim offered again", []rbacv1.PolicyRule{claimRule("configmaps"), claimRule("secrets")})
	testutil.Await(t, "the Granted condition to be True again", func() bool { s, _ := granted(); return s == "True" })

	// Withdrawn: the template deleted. MangoDBs stay offered (the CRD is
	// exported: its implicit offer), the claims go.
	start := time.Now()
	if err := templates.Delete(context.Background(), "attack-narrowed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	narrowed("the template deleted", []rbacv1.PolicyRule{})
	testutil.Await(t, "the export to lose its claims", func() bool { return len(export()) == 0 })
	t.Logf("the template deleted: the export lost its claims %v after", time.Since(start).Round(time.Millisecond))
	if !c.can(t, child, "create", "mangodb.com", "mangodbs") {
		t.Error("the still offered MangoDBs were taken away")
	}
	if c.can(t, child, "get", "", "secrets") || c.can(t, child, "get", "", "configmaps") {
		t.Error("a withdrawn claim is still granted")
	}

	// A template of the same name that claims more than is claimable is
	// not offered at all: nothing comes back, nothing widens.
	e.offerTemplate(t, templateYAML("attack-narrowed", claimSecrets, claimConfigs, claimAnything))
	time.Sleep(2 * time.Second)
	if got := e.rules(child, exportrequests.ConsumerClaimsRole); len(got) != 0 {
		t.Errorf("claims Role after a template with a wildcard claim: %v, want no rule", got)
	}
	if s, r := granted(); s != "False" || r != offers.ReasonOfferNarrowed {
		t.Errorf("Granted %s %s after a template with a wildcard claim, want False %s", s, r, offers.ReasonOfferNarrowed)
	}
	e.noWildcard(t, child)
}
