package kbcache

import (
	"bytes"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
)

// What a consumer writes reaches the cache as JSON: whatever it is, the
// cache decodes it or refuses it, trims it, and reads back what it kept.
func FuzzCompact(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"n","labels":{"a":"b"}},"spec":{"versions":[{"n":1}],"parameters":{}},"status":{"conditions":[{"message":"m"}]}}`))
	f.Add([]byte(`{"metadata":{"creationTimestamp":null,"ownerReferences":[{}]},"spec":1e400}`))
	f.Add([]byte(`{"status":{"conditions":[1,{"reason":"\u00fc"}]},"spec":{"versions":"sha256:x"}}`))
	opts := Options{Labels: []string{"a"}, Drop: [][]string{{"status", "phase"}}, Digest: [][]string{{"spec", "versions"}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Compact[widget]{}
		if err := c.UnmarshalJSON(data); err != nil {
			return
		}
		if _, err := Transform(opts)(c); err != nil {
			t.Fatal(err)
		}
		u, err := c.Unstructured()
		if err != nil {
			return // a body no JSON decoder of numbers takes (1e400): refused when read
		}
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatalf("cannot write what was kept: %v", err)
		}
		again := &Compact[widget]{}
		if err := again.UnmarshalJSON(out); err != nil {
			t.Fatalf("cannot decode %q: %v", out, err)
		}
		if !bytes.Equal(again.Body, c.Body) {
			t.Errorf("body %q read back as %q", c.Body, again.Body)
		}
		u2, err := again.Unstructured()
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(u.Object, u2.Object) {
			t.Errorf("%v read back as %v", u.Object, u2.Object)
		}
	})
}
