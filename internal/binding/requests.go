package binding

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// RequestAPIs makes, in provider namespace ns, one APIServiceExportRequest
// per API, named <resource>.<group>, as a v0.8.2 client would: for a
// consumer whose konnector makes none (kbind v2, docs/v2.md §2). The
// exports controller then decides them like any other request, so the
// consumer's rights on the APIs (a Role of exactly them in ns) come from
// the one place that grants, re-judges and withdraws them for every
// generation. A request that exists already is left as it is (its spec is
// immutable, and it names the same API).
func (p *Provisioner) RequestAPIs(ctx context.Context, ns string, apis []ExportedAPI) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	requests := p.dynamic.Resource(kbresources.APIServiceExportRequests).Namespace(ns)
	for _, api := range apis {
		versions := make([]any, 0, len(api.Versions))
		for _, v := range api.Versions {
			versions = append(versions, v)
		}
		req := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": kbresources.Group + "/" + kbresources.Version,
			"kind":       "APIServiceExportRequest",
			"metadata": map[string]any{
				"name":   api.Resource + "." + api.Group,
				"labels": map[string]any{LabelManagedBy: ManagedByValue},
			},
			"spec": map[string]any{
				"resources": []any{map[string]any{"group": api.Group, "resource": api.Resource, "versions": versions}},
			},
		}}
		err := retryForbidden(ctx, func() error {
			_, err := requests.Create(ctx, req, metav1.CreateOptions{FieldManager: fieldManager})
			return err
		})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("requesting %s in provider namespace %s: %w", api.Name, ns, err)
		}
	}
	return nil
}
