package binding

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
)

// warnings counts the WARN lines in logs about crd lacking a status
// subresource.
func warnings(logs *procs.Buffer, crd string) int {
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, `"crd":"`+crd+`"`) &&
			strings.Contains(line, "no status subresource") {
			n++
		}
	}
	return n
}

// An exported CRD without a status subresource is flagged in the catalog
// (for the selection page) and logged at WARN once per change of the CRD,
// not again for changes that leave its spec alone; adding the subresource
// clears the flag.
func TestCatalogWarnsAboutCRDWithoutStatusSubresource(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	logs := &procs.Buffer{}
	cat, err := NewCatalog(e.backend, ScopeNamespaced, WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	cat.Start(runCtx)
	if !cat.WaitForSync(runCtx) {
		t.Fatal("catalog never synced")
	}

	r := Resource{Group: "status.test", Resource: "nostatuses"}
	name := r.Resource + "." + r.Group
	if err := createCRD(ctx, e.crds, r, "NoStatus", apiextensionsv1.NamespaceScoped, true); err != nil {
		t.Fatal(err)
	}
	crds := e.crds.ApiextensionsV1().CustomResourceDefinitions()
	t.Cleanup(func() { crds.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	testutil.Await(t, "the CRD is offered", func() bool { _, ok := cat.Lookup(r.Group, r.Resource); return ok })
	api, _ := cat.Lookup(r.Group, r.Resource)
	if !slices.Equal(api.NoStatusSubresource, []string{"v1"}) {
		t.Errorf("NoStatusSubresource %v, want [v1] (v2 is not served)", api.NoStatusSubresource)
	}
	testutil.Await(t, "a WARN names the CRD", func() bool { return warnings(logs, name) == 1 })

	// A label change is an update event with the same generation: no
	// second warning.
	if _, err := crds.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the catalog sees the label", func() bool {
		crd, ok := cat.cached(name)
		return ok && crd.Labels["team"] == "a"
	})
	time.Sleep(200 * time.Millisecond)
	if n := warnings(logs, name); n != 1 {
		t.Errorf("%d warnings after a label change, want still 1", n)
	}

	// The provider adds the subresource: the flag goes, no warning.
	setStatus := func(on bool) {
		t.Helper()
		var sub any
		if on {
			sub = map[string]any{"status": map[string]any{}}
		}
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		versions := []any{}
		for _, v := range crd.Spec.Versions {
			b, _ := json.Marshal(v)
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			m["subresources"] = sub
			versions = append(versions, m)
		}
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"versions": versions}})
		if _, err := crds.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setStatus(true)
	testutil.Await(t, "the flag goes", func() bool {
		api, ok := cat.Lookup(r.Group, r.Resource)
		return ok && len(api.NoStatusSubresource) == 0
	})
	// ... and taken away again: a new change, a new warning.
	setStatus(false)
	testutil.Await(t, "a second WARN", func() bool { return warnings(logs, name) == 2 })
}
