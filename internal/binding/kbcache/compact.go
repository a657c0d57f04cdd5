package kbcache

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// Kind names the kind a Compact holds; its zero value answers.
type Kind interface {
	GroupVersionKind() schema.GroupVersionKind
}

// Compact is how a cache holds an object of a kind it has no Go type
// for: the metadata typed (selectors, indexes and owner references work
// on it as on any object) and everything else as the compact JSON the API
// server sent, trimmed by Transform. As unstructured maps the same object
// costs several times its size in map buckets; a cache of every
// consumer's objects is mostly that.
//
// Register each instantiation with its list under K's GroupVersionKind
// (Register); read the object with Unstructured.
type Compact[K Kind] struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	// Body is the JSON object of every field but apiVersion, kind and
	// metadata. It is replaced, never changed in place, so copies share it.
	Body []byte
}

// CompactList is the list of Compacts an informer lists into.
type CompactList[K Kind] struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Compact[K] `json:"items"`
}

// Register adds Compact[K] and CompactList[K] to s under K's kind.
func Register[K Kind](s *runtime.Scheme) {
	var k K
	gvk := k.GroupVersionKind()
	s.AddKnownTypeWithName(gvk, &Compact[K]{})
	s.AddKnownTypeWithName(gvk.GroupVersion().WithKind(gvk.Kind+"List"), &CompactList[K]{})
	metav1.AddToGroupVersion(s, gvk.GroupVersion())
}

// UnmarshalJSON keeps the metadata typed and the other fields as they came.
func (c *Compact[K]) UnmarshalJSON(data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return err
	}
	if fields == nil {
		return fmt.Errorf("%s: not a JSON object", kindOf[K]().Kind)
	}
	*c = Compact[K]{}
	for key, dst := range map[string]any{"apiVersion": &c.APIVersion, "kind": &c.Kind, "metadata": &c.ObjectMeta} {
		if raw, ok := fields[key]; ok {
			if err := json.Unmarshal(raw, dst); err != nil {
				return fmt.Errorf("%s: %s: %w", kindOf[K]().Kind, key, err)
			}
			delete(fields, key)
		}
	}
	if len(fields) == 0 {
		return nil
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	c.Body = body
	return nil
}

// MarshalJSON writes the object as the API server would.
func (c *Compact[K]) MarshalJSON() ([]byte, error) {
	u, err := c.Unstructured()
	if err != nil {
		return nil, err
	}
	return u.MarshalJSON()
}

// Unstructured is the object as unstructured maps, a copy of its own.
func (c *Compact[K]) Unstructured() (*unstructured.Unstructured, error) {
	obj := map[string]any{}
	if len(c.Body) > 0 {
		// Numbers become int64 where they are integers, as in objects
		// the dynamic client decodes (and so in what Digest sees).
		if err := utiljson.Unmarshal(c.Body, &obj); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", kindOf[K]().Kind, c.Namespace, c.Name, err)
		}
	}
	meta, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&c.ObjectMeta)
	if err != nil {
		return nil, err
	}
	obj["metadata"] = meta
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(kindOf[K]())
	return u, nil
}

// DecodeBody decodes the fields besides the metadata into v (a struct of
// the few a reader needs costs less than Unstructured).
func (c *Compact[K]) DecodeBody(v any) error {
	if len(c.Body) == 0 {
		return nil
	}
	return json.Unmarshal(c.Body, v)
}

// DeepCopyObject copies the metadata and shares the body, which nobody
// changes.
func (c *Compact[K]) DeepCopyObject() runtime.Object {
	out := &Compact[K]{TypeMeta: c.TypeMeta, Body: c.Body}
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}

// DeepCopyObject copies the list; its items share their bodies.
func (l *CompactList[K]) DeepCopyObject() runtime.Object {
	out := &CompactList[K]{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Compact[K], len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].DeepCopyObject().(*Compact[K])
		}
	}
	return out
}

func (c *Compact[K]) body() *[]byte { return &c.Body }

func kindOf[K Kind]() schema.GroupVersionKind {
	var k K
	return k.GroupVersionKind()
}
