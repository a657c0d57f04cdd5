package binding

import (
	"fmt"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// Scope is what a consumer may bind (--consumer-scope): with Namespaced
// only namespaced APIs are offered, with Cluster every exported API.
type Scope string

const (
	ScopeNamespaced Scope = "Namespaced"
	ScopeCluster    Scope = "Cluster"
)

// ParseScope accepts "Namespaced" or "Cluster", in any letter case.
func ParseScope(s string) (Scope, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "namespaced":
		return ScopeNamespaced, nil
	case "cluster":
		return ScopeCluster, nil
	}
	return "", fmt.Errorf("consumer scope %q: want Namespaced or Cluster", s)
}

// allows says whether a CRD of the given scope is offered to consumers.
func (s Scope) allows(crdScope apiextensionsv1.ResourceScope) bool {
	return s == ScopeCluster || crdScope == apiextensionsv1.NamespaceScoped
}
