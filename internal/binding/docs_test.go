package binding

import (
	"os"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// docs/binding.md shows the ClusterRoles the chart must ship; they must be
// exactly the ones the code expects.
func TestDocumentedClusterRoles(t *testing.T) {
	b, err := os.ReadFile("../../docs/binding.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "<!-- clusterroles -->\n```yaml\n")
	if !ok {
		t.Fatal("docs/binding.md has no ClusterRoles block")
	}
	block, _, _ := strings.Cut(after, "```")
	var docs []string
	for _, d := range strings.Split(block, "---\n") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}
	want := ClusterRoles()
	if len(docs) != len(want) {
		t.Fatalf("%d ClusterRoles documented, want %d", len(docs), len(want))
	}
	for i, d := range docs {
		var got rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict([]byte(d), &got); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(&got, want[i]) {
			t.Errorf("documented ClusterRole %s differs from the code's %s", got.Name, want[i].Name)
		}
	}
}
