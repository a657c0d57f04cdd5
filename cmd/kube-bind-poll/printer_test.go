package main

import (
	"bytes"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The shapes kubectl -o json and -o yaml print: a v1 List, JSON indented
// by four spaces, managedFields left out unless asked for.
func TestPrinter(t *testing.T) {
	binding := func() []unstructured.Unstructured {
		return []unstructured.Unstructured{{Object: map[string]any{
			"apiVersion": "kube-bind.io/v1alpha2", "kind": "APIServiceBinding",
			"metadata": map[string]any{"name": "widgets.example.com", "managedFields": []any{map[string]any{"manager": "kube-bind-poll"}}},
			"spec":     map[string]any{"kubeconfigSecretRef": map[string]any{"name": "kubeconfig-abc", "namespace": "kube-bind"}},
		}}}
	}
	const wantJSON = `{
    "apiVersion": "v1",
    "items": [
        {
            "apiVersion": "kube-bind.io/v1alpha2",
            "kind": "APIServiceBinding",
            "metadata": {
                "name": "widgets.example.com"
            },
            "spec": {
                "kubeconfigSecretRef": {
                    "name": "kubeconfig-abc",
                    "namespace": "kube-bind"
                }
            }
        }
    ],
    "kind": "List"
}
`
	const wantYAML = `apiVersion: v1
items:
- apiVersion: kube-bind.io/v1alpha2
  kind: APIServiceBinding
  metadata:
    managedFields:
    - manager: kube-bind-poll
    name: widgets.example.com
  spec:
    kubeconfigSecretRef:
      name: kubeconfig-abc
      namespace: kube-bind
kind: List
`
	for _, tc := range []struct {
		format            string
		showManagedFields bool
		want              string
	}{
		{"json", false, wantJSON},
		{"yaml", true, wantYAML},
	} {
		p, err := newPrinter(tc.format, tc.showManagedFields)
		if err != nil {
			t.Fatal(err)
		}
		items := binding()
		var out bytes.Buffer
		if err := p.printList(&out, items); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("-o %s:\n%s\nwant\n%s", tc.format, out.String(), tc.want)
		}
		if items[0].GetManagedFields() == nil {
			t.Errorf("-o %s: the printed objects' managedFields were dropped in place", tc.format)
		}
	}

	raw := []byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"BindingResponse","note":"a: b"}` + "\n")
	for format, want := range map[string]string{
		"json": "{\n    \"apiVersion\": \"kube-bind.io/v1alpha1\",\n    \"kind\": \"BindingResponse\",\n    \"note\": \"a: b\"\n}\n",
		"yaml": "apiVersion: kube-bind.io/v1alpha1\nkind: BindingResponse\nnote: 'a: b'\n",
	} {
		p, err := newPrinter(format, false)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := p.printJSON(&out, raw); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Errorf("-o %s of a JSON document:\n%q\nwant\n%q", format, out.String(), want)
		}
	}

	if _, err := newPrinter("file.json", false); err == nil {
		t.Error(`-o file.json: no error`)
	}
}
