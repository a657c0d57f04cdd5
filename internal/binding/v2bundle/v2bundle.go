// Package v2bundle builds the one-apply bundle a kbind v2 konnector
// (core.kbind.io/v1alpha1) needs from a completed bind: the consumer's
// namespace, the kubeconfig Secret, a Connection naming it, and one
// namespaced Binding per picked API (docs/v2.md). It is pure: the bind
// made everything on the provider side already.
package v2bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/binding"
)

// GroupVersion is the API of the v2 konnector's objects.
const GroupVersion = "core.kbind.io/v1alpha1"

// Names and labels of the consumer-side objects.
const (
	// SecretName is the kubeconfig Secret in the consumer namespace.
	SecretName = "kube-bind-kubeconfig"
	// SecretKey is its key.
	SecretKey = "kubeconfig"
	// LabelBinding names the provider namespace on every object of a
	// bundle, so that `kubectl delete -l` finds them again.
	LabelBinding   = "kube-bind.io/binding"
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "kube-bind-backend"
)

// Input is what a completed bind yields.
type Input struct {
	// Namespace is the consumer's provider namespace; the bundle uses the
	// same name on the consumer side, since v2 keeps namespaces.
	Namespace string
	// Kubeconfig is the kubeconfig issued by the bind. It is a
	// credential: never log it.
	Kubeconfig []byte
	// APIs are the picked APIs as the catalog resolved them.
	APIs []binding.ExportedAPI
}

// Errors of Build.
var (
	ErrNoAPIs = errors.New("nothing picked to bind")
	// ErrClusterScoped: a cluster-scoped API would sync names every
	// consumer of the provider shares; v2 binds namespaced APIs only.
	ErrClusterScoped = errors.New("cluster-scoped APIs cannot be bound for kbind v2 consumers")
)

// Bundle is the objects to apply, in order.
type Bundle struct {
	Objects []any
}

// Build makes the bundle of in, or says why it cannot: a whole bundle or
// none, never part of a selection.
func Build(in Input) (*Bundle, error) {
	if errs := validation.IsDNS1123Label(in.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("namespace %q: %v", in.Namespace, errs)
	}
	if len(in.Kubeconfig) == 0 {
		return nil, errors.New("no kubeconfig")
	}
	if len(in.APIs) == 0 {
		return nil, ErrNoAPIs
	}
	labels := map[string]string{labelManagedBy: managedBy, LabelBinding: in.Namespace}
	meta := func(name, namespace string) objectMeta {
		return objectMeta{Name: name, Namespace: namespace, Labels: labels}
	}
	b := &Bundle{Objects: []any{
		object{APIVersion: "v1", Kind: "Namespace", Metadata: meta(in.Namespace, "")},
		secret{
			object: object{APIVersion: "v1", Kind: "Secret", Metadata: meta(SecretName, in.Namespace)},
			Type:   "Opaque",
			Data:   map[string][]byte{SecretKey: in.Kubeconfig},
		},
		connection{
			object: object{APIVersion: GroupVersion, Kind: "Connection", Metadata: meta(in.Namespace, "")},
			Spec: connectionSpec{
				KubeconfigSecretRef: secretRef{Namespace: in.Namespace, Name: SecretName, Key: SecretKey},
				Schema:              schemaSpec{Source: "CRD", PullPolicy: "Bound", UpdatePolicy: "Always"},
			},
		},
	}}
	seen := map[string]bool{}
	for _, api := range in.APIs {
		if api.Scope != apiextensionsv1.NamespaceScoped {
			return nil, fmt.Errorf("%s: %w", api.Name, ErrClusterScoped)
		}
		if errs := validation.IsDNS1123Subdomain(api.Name); len(errs) > 0 {
			return nil, fmt.Errorf("API name %q: %v", api.Name, errs)
		}
		if seen[api.Name] {
			continue
		}
		seen[api.Name] = true
		b.Objects = append(b.Objects, bindingObject{
			object: object{APIVersion: GroupVersion, Kind: "Binding", Metadata: meta(api.Name, in.Namespace)},
			Spec: bindingSpec{
				ConnectionRef:  localRef{Name: in.Namespace},
				APIs:           []localRef{{Name: api.Name}},
				ConflictPolicy: "Fail",
			},
		})
	}
	return b, nil
}

// JSON renders the bundle as a v1/List, which kubectl applies as it is.
func (b *Bundle) JSON() ([]byte, error) {
	out, err := json.Marshal(struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Items      []any  `json:"items"`
	}{"v1", "List", b.Objects})
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// YAML renders the bundle as YAML documents separated by "---".
func (b *Bundle) YAML() ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range b.Objects {
		if i > 0 {
			buf.WriteString("---\n")
		}
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		buf.Write(y)
	}
	return buf.Bytes(), nil
}

// The wire shapes of the objects, with exactly the fields the bundle sets.

type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type object struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
}

type secret struct {
	object
	Type string            `json:"type"`
	Data map[string][]byte `json:"data"`
}

type connection struct {
	object
	Spec connectionSpec `json:"spec"`
}

type connectionSpec struct {
	KubeconfigSecretRef secretRef  `json:"kubeconfigSecretRef"`
	Schema              schemaSpec `json:"schema"`
	AutoBind            bool       `json:"autoBind"`
}

type secretRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

type schemaSpec struct {
	Source       string `json:"source"`
	PullPolicy   string `json:"pullPolicy"`
	UpdatePolicy string `json:"updatePolicy"`
}

type bindingObject struct {
	object
	Spec bindingSpec `json:"spec"`
}

type bindingSpec struct {
	ConnectionRef  localRef   `json:"connectionRef"`
	APIs           []localRef `json:"apis"`
	ConflictPolicy string     `json:"conflictPolicy"`
}

type localRef struct {
	Name string `json:"name"`
}

// maxItems bounds the objects ListToYAML renders: a bundle has three
// and one per picked API.
const maxItems = 1000

// ListToYAML renders a bundle stored as JSON (JSON's output) as YAML
// documents, the way YAML renders it. The bytes come from the session
// store, so they are read as input: anything but a v1/List of objects is
// an error.
func ListToYAML(list []byte) ([]byte, error) {
	var l struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(list, &l); err != nil {
		return nil, fmt.Errorf("not a stored bundle: %w", err)
	}
	if l.APIVersion != "v1" || l.Kind != "List" || len(l.Items) == 0 || len(l.Items) > maxItems {
		return nil, errors.New("not a stored bundle: want a v1/List of objects")
	}
	var buf bytes.Buffer
	for i, item := range l.Items {
		var obj map[string]any
		if err := json.Unmarshal(item, &obj); err != nil || obj == nil {
			return nil, fmt.Errorf("not a stored bundle: item %d is not an object", i)
		}
		y, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(y)
	}
	return buf.Bytes(), nil
}
