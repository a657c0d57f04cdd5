package v2bundle

import (
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// FuzzListToYAML: a stored bundle is read back from the session store, so
// any bytes must end in YAML or an error, never a panic; YAML that comes
// out holds one document per item, each an object.
func FuzzListToYAML(f *testing.F) {
	b, _ := Build(testInput)
	j, _ := b.JSON()
	f.Add(j)
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"a":{"b":[1,2,{"c":null}]}}]}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		y, err := ListToYAML(in)
		if err != nil {
			return
		}
		for _, doc := range splitDocs(string(y)) {
			var obj map[string]any
			if err := utilyaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("document %q does not parse: %v", doc, err)
			}
		}
	})
}
