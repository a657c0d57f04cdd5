package v2bundle

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kbprovider/backend/internal/binding"
)

func api(name string, scope apiextensionsv1.ResourceScope) binding.ExportedAPI {
	resource, group, _ := strings.Cut(name, ".")
	return binding.ExportedAPI{Name: name, Group: group, Resource: resource, Kind: "K", Scope: scope, Versions: []string{"v1"}}
}

var testInput = Input{
	Namespace:  "kube-bind-abc123",
	Kubeconfig: []byte("apiVersion: v1\nkind: Config\n"),
	APIs: []binding.ExportedAPI{
		api("mangodbs.mangodb.com", apiextensionsv1.NamespaceScoped),
		api("widgets.example.com", apiextensionsv1.NamespaceScoped),
		api("mangodbs.mangodb.com", apiextensionsv1.NamespaceScoped),
	},
}

// decodeYAML splits a multi-document YAML into objects.
func decodeYAML(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range splitDocs(string(b)) {
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("document %q: %v", doc, err)
		}
		out = append(out, u)
	}
	return out
}

func decodeList(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	var list unstructured.UnstructuredList
	if err := list.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	if list.GetKind() != "List" || list.GetAPIVersion() != "v1" {
		t.Errorf("list is %s %s", list.GetAPIVersion(), list.GetKind())
	}
	var out []*unstructured.Unstructured
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out
}

// Both renderings carry the same objects, in apply order: the namespace,
// the Secret with the kubeconfig, the Connection naming that Secret, and
// one Binding per picked API (duplicates dropped) in the namespace.
func TestBuildRendersTheBundle(t *testing.T) {
	b, err := Build(testInput)
	if err != nil {
		t.Fatal(err)
	}
	y, err := b.YAML()
	if err != nil {
		t.Fatal(err)
	}
	j, err := b.JSON()
	if err != nil {
		t.Fatal(err)
	}
	for name, objs := range map[string][]*unstructured.Unstructured{"yaml": decodeYAML(t, y), "json": decodeList(t, j)} {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, o := range objs {
				got = append(got, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
				if o.GetLabels()[LabelBinding] != testInput.Namespace {
					t.Errorf("%s %s: labels %v", o.GetKind(), o.GetName(), o.GetLabels())
				}
			}
			want := []string{
				"Namespace /kube-bind-abc123",
				"Secret kube-bind-abc123/kube-bind-kubeconfig",
				"Connection /kube-bind-abc123",
				"Binding kube-bind-abc123/mangodbs.mangodb.com",
				"Binding kube-bind-abc123/widgets.example.com",
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			data, _, _ := unstructured.NestedString(objs[1].Object, "data", SecretKey)
			if data != "YXBpVmVyc2lvbjogdjEKa2luZDogQ29uZmlnCg==" {
				t.Errorf("Secret data %q is not the kubeconfig in base64", data)
			}
			ref, _, _ := unstructured.NestedStringMap(objs[2].Object, "spec", "kubeconfigSecretRef")
			if ref["namespace"] != "kube-bind-abc123" || ref["name"] != SecretName || ref["key"] != SecretKey {
				t.Errorf("Connection's secret ref %v", ref)
			}
			src, _, _ := unstructured.NestedString(objs[2].Object, "spec", "schema", "source")
			if src != "CRD" || objs[2].GetAPIVersion() != GroupVersion {
				t.Errorf("Connection %s, schema source %q", objs[2].GetAPIVersion(), src)
			}
			for _, o := range objs[3:] {
				conn, _, _ := unstructured.NestedString(o.Object, "spec", "connectionRef", "name")
				apis, _, _ := unstructured.NestedSlice(o.Object, "spec", "apis")
				if conn != "kube-bind-abc123" || len(apis) != 1 || apis[0].(map[string]any)["name"] != o.GetName() {
					t.Errorf("Binding %s: connection %q, apis %v", o.GetName(), conn, apis)
				}
			}
		})
	}
}

// A selection that cannot be bound whole is refused whole.
func TestBuildRefuses(t *testing.T) {
	with := func(f func(*Input)) Input {
		in := testInput
		in.APIs = append([]binding.ExportedAPI(nil), testInput.APIs...)
		f(&in)
		return in
	}
	for name, c := range map[string]struct {
		in   Input
		want error
	}{
		"cluster-scoped": {with(func(in *Input) {
			in.APIs = append(in.APIs, api("gadgets.example.com", apiextensionsv1.ClusterScoped))
		}), ErrClusterScoped},
		"nothing picked":  {with(func(in *Input) { in.APIs = nil }), ErrNoAPIs},
		"bad namespace":   {with(func(in *Input) { in.Namespace = "Kube_Bind" }), nil},
		"no kubeconfig":   {with(func(in *Input) { in.Kubeconfig = nil }), nil},
		"bad API name":    {with(func(in *Input) { in.APIs[0].Name = "a/b" }), nil},
		"empty namespace": {with(func(in *Input) { in.Namespace = "" }), nil},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Build(c.in)
			if err == nil || b != nil {
				t.Fatalf("Build = %v, %v; want an error", b, err)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
		})
	}
}

// The JSON rendering is one JSON value, and the YAML one has no empty
// document (kubectl would refuse neither, but a git diff would show it).
func TestRenderingsAreClean(t *testing.T) {
	b, err := Build(testInput)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := b.JSON()
	if !json.Valid(j) {
		t.Error("JSON is not valid")
	}
	y, _ := b.YAML()
	if strings.HasPrefix(string(y), "---") || strings.Contains(string(y), "---\n---") || !strings.HasSuffix(string(y), "\n") {
		t.Errorf("YAML:\n%s", y)
	}
}

// The YAML of a stored bundle is the YAML of the bundle.
func TestListToYAMLIsYAML(t *testing.T) {
	b, err := Build(testInput)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := b.JSON()
	y, _ := b.YAML()
	got, err := ListToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(y) {
		t.Errorf("ListToYAML:\n%s\nYAML:\n%s", got, y)
	}
	for _, bad := range []string{``, `null`, `[]`, `{"apiVersion":"v1","kind":"List","items":[]}`,
		`{"apiVersion":"v1","kind":"List","items":[1]}`, `{"apiVersion":"v1","kind":"List","items":[null]}`,
		`{"apiVersion":"v1","kind":"Secret"}`} {
		if _, err := ListToYAML([]byte(bad)); err == nil {
			t.Errorf("ListToYAML(%s) did not fail", bad)
		}
	}
}

func splitDocs(y string) []string { return strings.Split(y, "---\n") }
