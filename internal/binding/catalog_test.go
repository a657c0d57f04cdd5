package binding

import (
	"context"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/testutil"
)

func names(apis []ExportedAPI) []string {
	var out []string
	for _, a := range apis {
		out = append(out, a.Name)
	}
	return out
}

// The catalog follows CRDs being labelled, unlabelled and deleted, filters
// by consumer scope, lists served versions only and sorts by name.
func TestCatalogFollowsCRDs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	nsCat := startCatalog(t, e.backend, ScopeNamespaced)
	clCat := startCatalog(t, e.backend, ScopeCluster)

	zebras := Resource{Group: "catalog.test", Resource: "zebras"}
	apples := Resource{Group: "catalog.test", Resource: "apples"}
	tanks := Resource{Group: "catalog.test", Resource: "tanks"}
	for _, c := range []struct {
		r     Resource
		kind  string
		scope apiextensionsv1.ResourceScope
	}{
		{zebras, "Zebra", apiextensionsv1.NamespaceScoped},
		{apples, "Apple", apiextensionsv1.NamespaceScoped},
		{tanks, "Tank", apiextensionsv1.ClusterScoped},
	} {
		if err := createCRD(ctx, e.crds, c.r, c.kind, c.scope, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), c.r.Resource+"."+c.r.Group, metav1.DeleteOptions{})
		})
	}
	has := func(c *Catalog, r Resource) bool { _, ok := c.Lookup(r.Group, r.Resource); return ok }
	label := func(r Resource, value string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"` + ExportedLabel + `":` + value + `}}}`
		_, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, r.Resource+"."+r.Group, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}

	// Unlabelled CRDs are not offered.
	time.Sleep(200 * time.Millisecond)
	if has(nsCat, zebras) || has(clCat, tanks) {
		t.Fatal("unlabelled CRD offered")
	}

	label(zebras, `"true"`)
	label(apples, `"true"`)
	label(tanks, `"true"`)
	testutil.Await(t, "labelled CRDs are offered", func() bool {
		return has(nsCat, zebras) && has(nsCat, apples) && has(clCat, zebras) && has(clCat, tanks)
	})
	if has(nsCat, tanks) {
		t.Error("cluster-scoped CRD offered to Namespaced consumers")
	}
	api, _ := nsCat.Lookup("catalog.test", "zebras")
	want := ExportedAPI{Name: "zebras.catalog.test", Group: "catalog.test", Resource: "zebras", Kind: "Zebra",
		Scope: apiextensionsv1.NamespaceScoped, Versions: []string{"v1"}}
	if !equalAPI(api, want) {
		t.Errorf("Lookup = %+v, want %+v", api, want)
	}
	list := nsCat.List()
	if !slices.IsSortedFunc(list, func(a, b ExportedAPI) int { return strings.Compare(a.Name, b.Name) }) {
		t.Errorf("not sorted: %v", names(list))
	}
	for _, a := range list {
		if a.Scope != apiextensionsv1.NamespaceScoped {
			t.Errorf("Namespaced catalog lists %s (%s)", a.Name, a.Scope)
		}
	}
	if !slices.Contains(names(clCat.List()), "tanks.catalog.test") {
		t.Errorf("Cluster catalog misses tanks: %v", names(clCat.List()))
	}
	if slices.Contains(names(list), "confidentials.example.com") {
		t.Error("unexported CRD listed")
	}

	// A label with another value, then no label: gone.
	label(zebras, `"false"`)
	testutil.Await(t, "CRD labelled false is withdrawn", func() bool { return !has(nsCat, zebras) })
	label(zebras, `"true"`)
	testutil.Await(t, "CRD labelled again is offered", func() bool { return has(nsCat, zebras) })
	label(zebras, `null`)
	testutil.Await(t, "CRD without label is withdrawn", func() bool { return !has(nsCat, zebras) && !has(clCat, zebras) })

	// Deleted: gone.
	if err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, "apples.catalog.test", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "deleted CRD is withdrawn", func() bool { return !has(nsCat, apples) })
	if err := nsCat.Check(ctx); err != nil {
		t.Errorf("readiness check of a healthy catalog: %v", err)
	}
	if nsCat.Name() == "" {
		t.Error("empty check name")
	}
}

func equalAPI(a, b ExportedAPI) bool {
	return a.Name == b.Name && a.Group == b.Group && a.Resource == b.Resource && a.Kind == b.Kind &&
		a.Scope == b.Scope && slices.Equal(a.Versions, b.Versions)
}

// Started while the cluster is unreachable, the catalog neither fails nor
// blocks; readiness says why; once the cluster is reachable it syncs by
// itself.
func TestCatalogStartsWhileClusterDown(t *testing.T) {
	e := setup(t)
	addr := freeAddr(t)
	cfg := rest.CopyConfig(e.backend)
	upstream, _ := url.Parse(cfg.Host)
	cfg.Host = "https://" + addr
	cfg.ServerName = "127.0.0.1" // the serving certificate names 127.0.0.1

	c, err := NewCatalog(cfg, ScopeNamespaced)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx)
	time.Sleep(500 * time.Millisecond)
	if c.HasSynced() || len(c.List()) != 0 {
		t.Fatal("synced without a cluster")
	}
	err = c.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("readiness while down: %v", err)
	}

	p := startProxy(t, addr, upstream.Host)
	defer p.close()
	testutil.Await(t, "catalog syncs once the cluster is reachable", c.HasSynced)
	testutil.Await(t, "catalog offers widgets", func() bool { _, ok := c.Lookup(widgets.Group, widgets.Resource); return ok })
	if err := c.Check(ctx); err != nil {
		t.Fatalf("readiness once up: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// proxy forwards TCP connections to the API server; close cuts every
// connection at once, like an API server that went away.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, addr, upstream string) *proxy {
	t.Helper()
	var l net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", upstream)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *proxy) close() {
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// A CRD labelled core.kbind.io/exported=true (kbind v2) is offered as one
// with the existing label; with both, taking either away keeps it offered,
// taking both away withdraws it, and the catalog lists it once.
func TestCatalogHonoursV2Label(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	cat := startCatalog(t, e.backend, ScopeNamespaced)
	otters := Resource{Group: "catalog.test", Resource: "otters"}
	if err := createCRD(ctx, e.crds, otters, "Otter", apiextensionsv1.NamespaceScoped, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), "otters.catalog.test", metav1.DeleteOptions{})
	})
	label := func(key, value string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"` + key + `":` + value + `}}}`
		_, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, "otters.catalog.test", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	has := func() bool { _, ok := cat.Lookup("catalog.test", "otters"); return ok }
	count := func() int {
		n := 0
		for _, a := range cat.List() {
			if a.Name == "otters.catalog.test" {
				n++
			}
		}
		return n
	}

	label(ExportedLabelV2, `"true"`)
	testutil.Await(t, "a CRD with the v2 label is offered", has)
	if _, ok := cat.ExportedCRD("catalog.test", "otters"); !ok {
		t.Error("ExportedCRD misses the CRD with the v2 label")
	}
	label(ExportedLabel, `"true"`)
	testutil.Await(t, "a CRD with both labels is listed once", func() bool { return count() == 1 && has() })
	label(ExportedLabelV2, `null`)
	// The v2 informer drops it; the other still holds it.
	time.Sleep(200 * time.Millisecond)
	if !has() || count() != 1 {
		t.Fatalf("with one label left: offered %v, listed %d times", has(), count())
	}
	label(ExportedLabelV2, `"true"`)
	label(ExportedLabel, `null`)
	time.Sleep(200 * time.Millisecond)
	if !has() || count() != 1 {
		t.Fatalf("with the v2 label left: offered %v, listed %d times", has(), count())
	}
	label(ExportedLabelV2, `"false"`)
	testutil.Await(t, "a CRD with neither label true is withdrawn", func() bool { return !has() && count() == 0 })
	exported, err := cat.ExportedNow(ctx, "catalog.test", "otters")
	if err != nil || exported {
		t.Errorf("ExportedNow = %v, %v; want false", exported, err)
	}
	label(ExportedLabelV2, `"true"`)
	testutil.Await(t, "offered again", has)
	exported, err = cat.ExportedNow(ctx, "catalog.test", "otters")
	if err != nil || !exported {
		t.Errorf("ExportedNow = %v, %v; want true", exported, err)
	}
}
