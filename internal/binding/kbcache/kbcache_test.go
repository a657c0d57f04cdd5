package kbcache

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestTransformKeepsOnlyWhatIsRead(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{
			"name": "r", "namespace": "ns",
			"annotations":   map[string]any{"kube-bind.io/provisioned-at": "2025-01-01T00:00:00Z", "junk": big},
			"labels":        map[string]any{"app.kubernetes.io/managed-by": "kube-bind-backend", "junk": "y"},
			"managedFields": []any{map[string]any{"manager": "m"}},
		},
		"spec": map[string]any{"resources": []any{"a"}, "parameters": map[string]any{"p": big}, "other": big},
		"status": map[string]any{"phase": "Pending", "conditions": []any{
			map[string]any{"type": "Ready", "message": "ü" + big, "reason": big},
		}},
	}}
	out, err := Transform(Options{
		Annotations: []string{"kube-bind.io/provisioned-at", "absent"},
		Labels:      []string{"app.kubernetes.io/managed-by"},
		Drop:        [][]string{{"spec", "other"}},
	})(u)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*unstructured.Unstructured)
	if a := got.GetAnnotations(); len(a) != 1 || a["kube-bind.io/provisioned-at"] == "" {
		t.Errorf("annotations %v", a)
	}
	if l := got.GetLabels(); len(l) != 1 || l["app.kubernetes.io/managed-by"] == "" {
		t.Errorf("labels %v", l)
	}
	if got.GetManagedFields() != nil {
		t.Error("managedFields kept")
	}
	spec := got.Object["spec"].(map[string]any)
	if _, ok := spec["parameters"]; ok {
		t.Error("spec.parameters kept")
	}
	if _, ok := spec["other"]; ok {
		t.Error("dropped field kept")
	}
	if _, ok := spec["resources"]; !ok {
		t.Error("spec.resources lost")
	}
	c := got.Object["status"].(map[string]any)["conditions"].([]any)[0].(map[string]any)
	if m := c["message"].(string); len(m) > MaxConditionText || !strings.HasPrefix(m, "ü") {
		t.Errorf("message of %d bytes kept", len(m))
	}
	if r := c["reason"].(string); len(r) != MaxConditionText {
		t.Errorf("reason of %d bytes kept", len(r))
	}

	bare := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "b"}}}
	if _, err := Transform(Options{Drop: [][]string{{"status", "conditions"}}})(bare); err != nil {
		t.Fatal(err)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{"junk": big}}}
	if out, _ := Transform(Options{})(ns); len(out.(*corev1.Namespace).Annotations) != 0 {
		t.Error("typed object's annotations kept")
	}
}

func TestTruncateOnRuneBoundary(t *testing.T) {
	if got := Truncate("aü", 2); got != "a" {
		t.Errorf("got %q", got)
	}
	if got := Truncate("abc", 5); got != "abc" {
		t.Errorf("got %q", got)
	}
}

// A digested field is kept as the digest of its value: the same value
// decoded from JSON (as the informer gets it) and built in Go (as a
// controller wants it) digest alike, a changed one does not, and a
// second pass over a trimmed object keeps the digest.
func TestDigestedField(t *testing.T) {
	schema := strings.Repeat("s", 64<<10)
	decoded := &unstructured.Unstructured{}
	if err := decoded.UnmarshalJSON([]byte(`{"apiVersion":"v1","kind":"X","metadata":{"name":"x"},
		"spec":{"group":"g","versions":[{"name":"v1","served":true,"schema":{"openAPIV3Schema":{"type":"object","maxLength":3,"description":"` + schema + `"}}}]}}`)); err != nil {
		t.Fatal(err)
	}
	digest := Options{Digest: [][]string{{"spec", "versions"}, {"spec", "absent"}}}
	out, err := Transform(digest)(decoded)
	if err != nil {
		t.Fatal(err)
	}
	spec := out.(*unstructured.Unstructured).Object["spec"].(map[string]any)
	kept, ok := spec["versions"].(string)
	if !ok || len(kept) > 64 {
		t.Fatalf("spec.versions kept as %T of %d bytes", spec["versions"], len(kept))
	}
	if spec["group"] != "g" {
		t.Errorf("spec.group lost: %v", spec)
	}
	if _, ok := spec["absent"]; ok {
		t.Error("an absent digested field was added")
	}
	built := []any{map[string]any{"served": true, "name": "v1", "schema": map[string]any{
		"openAPIV3Schema": map[string]any{"description": schema, "type": "object", "maxLength": int64(3)}}}}
	if Digest(built) != kept {
		t.Error("the same versions built in Go digest differently from the decoded ones")
	}
	built[0].(map[string]any)["served"] = false
	if Digest(built) == kept {
		t.Error("changed versions digest like the cached ones")
	}
	again, _ := Transform(digest)(out)
	if again.(*unstructured.Unstructured).Object["spec"].(map[string]any)["versions"] != kept {
		t.Error("a second pass changed the digest")
	}
}
