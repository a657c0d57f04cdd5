package chart_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Every value in values.yaml is documented in the chart's README: its full
// dotted path, or that of an enclosing object documented as a whole (such
// as resources), appears in backticks.
func TestEveryValueIsDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := func(path string) bool {
		for p := path; p != ""; {
			if strings.Contains(string(readme), "| `"+p+"` |") {
				return true
			}
			i := strings.LastIndex(p, ".")
			if i < 0 {
				break
			}
			p = p[:i]
		}
		return false
	}
	var missing []string
	var walk func(prefix string, m map[string]any)
	n := 0
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			path := prefix + k
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !documented(path) {
				walk(path+".", sub)
				continue
			}
			n++
			if !documented(path) {
				missing = append(missing, path)
			}
		}
	}
	walk("", values)
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("values not documented in charts/kube-bind-backend/README.md: %v", missing)
	}
	if n < 40 {
		t.Fatalf("only %d values found; is values.yaml read correctly?", n)
	}
}
