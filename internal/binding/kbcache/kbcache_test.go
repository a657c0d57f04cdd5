package kbcache

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

type widget struct{}

func (widget) GroupVersionKind() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}
}

// decoded is obj as an informer hands it to the transform.
func decoded(t *testing.T, obj string) *Compact[widget] {
	t.Helper()
	c := &Compact[widget]{}
	if err := c.UnmarshalJSON([]byte(obj)); err != nil {
		t.Fatal(err)
	}
	return c
}

// transformed is what the cache keeps of c, as its readers see it.
func transformed(t *testing.T, o Options, c *Compact[widget]) *unstructured.Unstructured {
	t.Helper()
	out, err := Transform(o)(c)
	if err != nil {
		t.Fatal(err)
	}
	u, err := out.(*Compact[widget]).Unstructured()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestTransformKeepsOnlyWhatIsRead(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	got := transformed(t, Options{
		Annotations: []string{"kube-bind.io/provisioned-at", "absent"},
		Labels:      []string{"app.kubernetes.io/managed-by"},
		Drop:        [][]string{{"spec", "other"}},
	}, decoded(t, `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"r","namespace":"ns",
		"annotations":{"kube-bind.io/provisioned-at":"2025-01-01T00:00:00Z","junk":"`+big+`"},
		"labels":{"app.kubernetes.io/managed-by":"kube-bind-backend","junk":"y"},
		"managedFields":[{"manager":"m"}]},
		"spec":{"resources":["a"],"parameters":{"p":"`+big+`"},"other":"`+big+`"},
		"status":{"phase":"Pending","conditions":[{"type":"Ready","message":"ü`+big+`","reason":"`+big+`"}]}}`))
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
	if got.GetName() != "r" || got.GetNamespace() != "ns" || got.GroupVersionKind() != (widget{}).GroupVersionKind() {
		t.Errorf("identity lost: %s %s/%s", got.GroupVersionKind(), got.GetNamespace(), got.GetName())
	}

	bare := decoded(t, `{"metadata":{"name":"b"}}`)
	if _, err := Transform(Options{Drop: [][]string{{"status", "conditions"}}})(bare); err != nil {
		t.Fatal(err)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{"junk": big}}}
	if out, _ := Transform(Options{})(ns); len(out.(*corev1.Namespace).Annotations) != 0 {
		t.Error("typed object's annotations kept")
	}
}

// A Compact reads back as the object it was decoded from: integers stay
// int64 as in objects the dynamic client decodes, the metadata whole.
func TestCompactRoundTrip(t *testing.T) {
	c := decoded(t, `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"n","uid":"u1",
		"resourceVersion":"7","creationTimestamp":"2025-01-01T00:00:00Z","labels":{"a":"b"},
		"ownerReferences":[{"apiVersion":"v1","kind":"Namespace","name":"n","uid":"u0"}]},
		"spec":{"replicas":3,"ratio":0.5,"list":[{"k":"v"}]},"status":{"phase":"Bound"}}`)
	if c.Name != "w" || c.Namespace != "n" || c.ResourceVersion != "7" || c.Labels["a"] != "b" || len(c.OwnerReferences) != 1 {
		t.Fatalf("metadata %+v", c.ObjectMeta)
	}
	u, err := c.Unstructured()
	if err != nil {
		t.Fatal(err)
	}
	if n, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas"); n != 3 {
		t.Errorf("spec.replicas %v (%T)", u.Object["spec"].(map[string]any)["replicas"], u.Object["spec"].(map[string]any)["replicas"])
	}
	if f, _, _ := unstructured.NestedFloat64(u.Object, "spec", "ratio"); f != 0.5 {
		t.Errorf("spec.ratio %v", f)
	}
	if p, _, _ := unstructured.NestedString(u.Object, "status", "phase"); p != "Bound" {
		t.Errorf("status.phase %q", p)
	}
	if u.GetUID() != "u1" || u.GetCreationTimestamp().Year() != 2025 || len(u.GetOwnerReferences()) != 1 {
		t.Errorf("metadata %v", u.Object["metadata"])
	}
	// A copy is a copy: changing what one reader got changes nobody's.
	cp := c.DeepCopyObject().(*Compact[widget])
	cp.Labels["a"] = "changed"
	u.Object["spec"].(map[string]any)["replicas"] = int64(9)
	again, _ := c.Unstructured()
	if c.Labels["a"] != "b" || again.Object["spec"].(map[string]any)["replicas"] != int64(3) {
		t.Error("a copy shares what it must not")
	}
	for _, bad := range []string{`[]`, `null`, `{"metadata":"x"}`, `{"spec":`} {
		if err := (&Compact[widget]{}).UnmarshalJSON([]byte(bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
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
	c := decoded(t, `{"apiVersion":"v1","kind":"X","metadata":{"name":"x"},
		"spec":{"group":"g","versions":[{"name":"v1","served":true,"schema":{"openAPIV3Schema":{"type":"object","maxLength":3,"description":"`+schema+`"}}}]}}`)
	digest := Options{Digest: [][]string{{"spec", "versions"}, {"spec", "absent"}}}
	spec := transformed(t, digest, c).Object["spec"].(map[string]any)
	kept, ok := spec["versions"].(string)
	if !ok || len(kept) > 64 {
		t.Fatalf("spec.versions kept as %T of %d bytes", spec["versions"], len(kept))
	}
	if len(c.Body) > 256 {
		t.Errorf("the cached body is %d bytes", len(c.Body))
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
	if transformed(t, digest, c).Object["spec"].(map[string]any)["versions"] != kept {
		t.Error("a second pass changed the digest")
	}
}
