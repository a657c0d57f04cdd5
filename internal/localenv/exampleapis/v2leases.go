package exampleapis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

// V2LeasePolicyFile is the chart's admission policy of the v2 konnectors'
// Lease namespace.
func V2LeasePolicyFile() string {
	return filepath.Join(procs.RepoRoot(), "charts", "kube-bind-backend", "files", "kbind-v2-lease-policy.yaml")
}

// InstallV2Leases makes on cp what the chart makes for kbind v2
// konnectors: the ClusterRoles, the Lease namespace and its grants
// (binding.InstallV2Access), and the chart's own admission policy file.
// A policy takes effect a moment after it is made: callers that test it
// wait until it refuses what it must.
func InstallV2Leases(ctx context.Context, cp *controlplane.ControlPlane) error {
	admin := cp.AdminConfig()
	if err := binding.InstallClusterRoles(ctx, admin); err != nil {
		return err
	}
	if err := binding.InstallV2Access(ctx, admin); err != nil {
		return err
	}
	b, err := os.ReadFile(V2LeasePolicyFile())
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", V2LeasePolicyFile(), err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvk := u.GroupVersionKind()
		resources := map[string]string{
			"MutatingAdmissionPolicy": "mutatingadmissionpolicies", "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
			"ValidatingAdmissionPolicy": "validatingadmissionpolicies", "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
		}
		resource, ok := resources[gvk.Kind]
		if !ok {
			return fmt.Errorf("%s: unexpected kind %s", V2LeasePolicyFile(), gvk.Kind)
		}
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource}
		if _, err := dyn.Resource(gvr).Apply(ctx, u.GetName(), &u, metav1.ApplyOptions{FieldManager: "kube-bind-localenv", Force: true}); err != nil {
			return fmt.Errorf("applying %s %s: %w", gvk.Kind, u.GetName(), err)
		}
	}
}
