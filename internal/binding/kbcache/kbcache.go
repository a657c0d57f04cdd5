// Package kbcache trims objects before they enter an informer's cache,
// and holds the kinds it has no Go type for compactly (Compact).
// Consumers write kube-bind objects on the provider cluster, and every
// replica's leader caches them cluster-wide: what a cache holds must be
// bounded by what the controllers read, not by what a consumer stored
// (annotations of 256 KiB, free-form fields, long condition messages).
package kbcache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/tools/cache"
)

// MaxConditionText is how much of a condition's message and reason a
// cache keeps; the controllers compare only their own, shorter ones.
const MaxConditionText = 256

// Options say what a cache keeps besides names, namespaces, UIDs,
// resource versions, owner references, deletion marks and the fields
// not dropped.
type Options struct {
	// Annotations and Labels the controller reads; all others are dropped.
	Annotations []string
	Labels      []string
	// Drop lists fields the controller never reads, e.g. {"spec"}.
	Drop [][]string
	// Digest lists fields the controller compares with what it would
	// write but never reads: the cache keeps Digest of their value
	// instead (a CRD's schema copied into each consumer's namespace is
	// kilobytes to megabytes, its digest 39 bytes).
	Digest [][]string
}

// digestPrefix marks a value Digest made.
const digestPrefix = "sha256:"

// Digest is what the cache keeps of a field listed in Options.Digest:
// a hash of v's JSON (keys sorted), so that a value decoded from the API
// server and the same value built by a controller digest alike.
func Digest(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// Only a value that JSON cannot hold, which neither a decoded
		// object nor a controller's desired state is: it equals nothing.
		return digestPrefix + "unencodable"
	}
	sum := sha256.Sum256(b)
	return digestPrefix + hex.EncodeToString(sum[:16])
}

// Transform returns a cache.TransformFunc for SetTransform. It always
// drops managedFields and keeps only the listed annotations and labels;
// of a Compact's body it drops spec.parameters, condition text beyond
// MaxConditionText and o.Drop, and digests o.Digest.
func Transform(o Options) cache.TransformFunc {
	return func(obj any) (any, error) {
		m, ok := obj.(metav1.Object)
		if !ok {
			return obj, nil // a DeletedFinalStateUnknown: its object was trimmed when cached
		}
		m.SetManagedFields(nil)
		m.SetAnnotations(only(m.GetAnnotations(), o.Annotations))
		m.SetLabels(only(m.GetLabels(), o.Labels))
		b, ok := obj.(interface{ body() *[]byte })
		if !ok || len(*b.body()) == 0 {
			return obj, nil
		}
		// A body that does not decode (the API server sends none) is kept
		// for its reader to refuse: an error here would fail the whole
		// list, and no cache would ever sync.
		body := map[string]any{}
		if err := utiljson.Unmarshal(*b.body(), &body); err != nil {
			return obj, nil
		}
		trim(body, o)
		if trimmed, err := json.Marshal(body); err == nil {
			*b.body() = trimmed
		}
		return obj, nil
	}
}

// trim applies o to the fields of an object besides its metadata.
func trim(obj map[string]any, o Options) {
	unstructured.RemoveNestedField(obj, "spec", "parameters")
	for _, f := range o.Drop {
		unstructured.RemoveNestedField(obj, f...)
	}
	for _, f := range o.Digest {
		if v, found, _ := unstructured.NestedFieldNoCopy(obj, f...); found {
			if s, ok := v.(string); ok && strings.HasPrefix(s, digestPrefix) {
				continue // trimmed already (an object the informer hands back)
			}
			_ = unstructured.SetNestedField(obj, Digest(v), f...)
		}
	}
	status, _ := obj["status"].(map[string]any)
	if conds, ok := status["conditions"].([]any); ok {
		for _, c := range conds {
			if c, ok := c.(map[string]any); ok {
				for _, k := range []string{"message", "reason"} {
					if s, ok := c[k].(string); ok {
						c[k] = Truncate(s, MaxConditionText)
					}
				}
			}
		}
	}
}

func only(have map[string]string, keep []string) map[string]string {
	var out map[string]string
	for _, k := range keep {
		if v, ok := have[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keep))
			}
			out[k] = v
		}
	}
	return out
}

// Truncate cuts s to at most n bytes, on a rune boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
