package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// deliveredAt reads the delivery mark on the consumer's ClusterBinding
// once, without waiting: a response is handed out only after its mark is
// written, so whoever holds the response finds it there.
func (e *env) deliveredAt(t *testing.T, namespace string) string {
	t.Helper()
	cb, err := dynamic.NewForConfigOrDie(e.cp.AdminConfig()).Resource(kbresources.ClusterBindings).Namespace(namespace).
		Get(context.Background(), binding.ClusterBindingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := time.Parse(time.RFC3339, cb.GetAnnotations()[binding.AnnotationProvisionedAt]); err != nil {
		t.Errorf("ClusterBinding %s/cluster: annotation %s = %q, want a time", namespace, binding.AnnotationProvisionedAt, cb.GetAnnotations()[binding.AnnotationProvisionedAt])
	}
	return cb.GetAnnotations()[binding.AnnotationDeliveredAt]
}

// requireDelivered checks that the backend recorded on the consumer's
// ClusterBinding that the response was handed out (and that the bind
// completed): the marks the garbage collection of unused bindings reads.
func (e *env) requireDelivered(t *testing.T, namespace string) {
	t.Helper()
	if at := e.deliveredAt(t, namespace); !validTime(at) {
		t.Errorf("ClusterBinding %s/cluster: annotation %s = %q once the response was received, want a time", namespace, binding.AnnotationDeliveredAt, at)
	}
}

func validTime(s string) bool {
	_, err := time.Parse(time.RFC3339, s)
	return err == nil
}

// refuseDeliveryMarks makes the API server refuse every write that leaves
// the delivery mark on the ClusterBinding of namespace (an admission
// policy), until the returned function lifts it. Both wait until the
// API server acts on the change.
func (e *env) refuseDeliveryMarks(t *testing.T, namespace string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	name := "e2e-refuse-delivery-" + namespace
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{kbresources.ClusterBindings.Group}, APIVersions: []string{"*"},
						Resources: []string{kbresources.ClusterBindings.Resource}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: `!has(object.metadata.annotations) || !('` + binding.AnnotationDeliveredAt + `' in object.metadata.annotations)`,
				Message:    "the test refuses delivery marks",
			}},
		},
	}
	policyBinding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": namespace},
			}},
		},
	}
	policies := e.kube.AdmissionregistrationV1()
	if _, err := policies.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := policies.ValidatingAdmissionPolicyBindings().Create(ctx, policyBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cbs := dynamic.NewForConfigOrDie(e.cp.AdminConfig()).Resource(kbresources.ClusterBindings).Namespace(namespace)
	markRefused := func() bool {
		patch := []byte(`{"metadata":{"annotations":{"` + binding.AnnotationDeliveredAt + `":"2026-01-01T00:00:00Z"}}}`)
		_, err := cbs.Patch(ctx, binding.ClusterBindingName, types.MergePatchType, patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil
	}
	testutil.Await(t, "the API server refuses delivery marks in "+namespace, markRefused)
	lifted := false
	lift = func() {
		if lifted {
			return
		}
		lifted = true
		if err := policies.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := policies.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Await(t, "the API server accepts delivery marks in "+namespace, func() bool { return !markRefused() })
	}
	t.Cleanup(lift)
	return lift
}

// No response leaves the backend before its binding is marked delivered
// on the provider cluster: a poll whose mark cannot be written gets 503
// with Retry-After and no response, and gets the response, marked, once
// the mark can be written; POST /api/bind marks before it answers.
func TestDeliveryMarkedBeforeResponse(t *testing.T) {
	user := binder("deliveries")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{user}})

	s := e.createRawSession(t, "")
	client, form := e.loginToSelection(t, s.authURL(t, nil), user)
	if status, body := e.post(t, client, form, nil); status != http.StatusOK {
		t.Fatalf("bind: %d %s", status, body)
	}
	namespaces := e.consumerNamespaces(t, user)
	if len(namespaces) != 1 {
		t.Fatalf("namespaces of %s: %v", user.Name, namespaces)
	}
	ns := namespaces[0]
	if at := e.deliveredAt(t, ns); at != "" {
		t.Fatalf("marked delivered (%s) before any poll", at)
	}

	lift := e.refuseDeliveryMarks(t, ns)
	resp, body := send(t, http.DefaultClient, s.signedPollURL(t))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, "temporarily_unavailable") || !strings.Contains(body, "delivery of the binding response could not be recorded") ||
		strings.Contains(body, "kubeconfig") {
		t.Fatalf("poll while the mark is refused: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if at := e.deliveredAt(t, ns); at != "" {
		t.Fatalf("marked delivered (%s) though the mark was refused", at)
	}
	lift()
	if br := s.poll(t); len(br.Kubeconfig) == 0 {
		t.Fatal("the poll after the API server accepts marks again got no kubeconfig")
	}
	e.requireDelivered(t, ns)

	token := e.cliLogin(t, user)
	_, direct := boundNamespace(t, e.apiBind(t, token, "deliveries-cluster"))
	e.requireDelivered(t, direct)
}
