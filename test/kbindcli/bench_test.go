package kbindcli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/chromium"
)

// BenchmarkBindToProvider measures, for each client, the time from
// pressing Bind in the browser to an object created in the consumer
// cluster reaching the provider: the command finishing the bind, the
// konnector making the bound CRD, the object created as soon as it is
// served, and the konnector syncing it up. Each iteration binds an API
// of its own. The third client is the released kubectl-bind against
// upstream's own backend v0.8.2 (its web UI, clusters of its own), for
// comparison; it needs UpstreamSrcEnv. Run with
//
//	go test -run '^$' -bench BindToProvider -benchtime 5x ./test/kbindcli/
//
// and read the p50 metric; README.md has the method and the figures.
func BenchmarkBindToProvider(b *testing.B) {
	src := upstreamSrc(b)
	e := startEnv(b)
	startKonnector(b, e)
	home := b.TempDir()
	login(b, e, home, alice)
	poll, cleanup, err := procs.Build("./cmd/kube-bind-poll")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cleanup)
	// Everything of both backends runs during every client's iterations.
	up := startUpstream(b, src)

	ours := func(tb testing.TB, api exampleapis.API) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := exampleapis.Prepare(ctx, e.provider, api); err != nil {
			tb.Fatal(err)
		}
	}
	clients := []struct {
		name               string
		consumer, provider *rest.Config
		// offer makes api bindable.
		offer func(tb testing.TB, api exampleapis.API)
		// start starts the client and returns the URL it asks to open.
		start func(tb testing.TB) (*procs.Command, string)
		// press binds api at u in the browser, returning when Bind was
		// pressed.
		press func(tb testing.TB, u string, api exampleapis.API) time.Time
	}{
		{"kubectl-bind-v0.8.2", e.consumer.AdminConfig(), e.provider.AdminConfig(), ours, func(tb testing.TB) (*procs.Command, string) {
			c := runCLI(tb, home, "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
			return c, printedURL(tb, c)
		}, func(tb testing.TB, u string, api exampleapis.API) time.Time {
			return pressBind(tb, u, e.baseURL, api.Name())
		}},
		{"kube-bind-poll", e.consumer.AdminConfig(), e.provider.AdminConfig(), ours, func(tb testing.TB) (*procs.Command, string) {
			h := tb.TempDir()
			c := procs.Start(tb, h, poll, []string{"--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-konnector", e.baseURL + "/export"},
				"HOME="+h, "KUBECONFIG=")
			return c, c.URL(tb)
		}, func(tb testing.TB, u string, api exampleapis.API) time.Time {
			return pressBind(tb, u, e.baseURL, api.Name())
		}},
		{"kubectl-bind-v0.8.2-upstream-backend-v0.8.2", up.consumer.AdminConfig(), up.provider.AdminConfig(), up.offer, func(tb testing.TB) (*procs.Command, string) {
			c := runCLI(tb, up.home, "--kubeconfig", up.consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
			return c, printedURL(tb, c)
		}, func(tb testing.TB, u string, api exampleapis.API) time.Time {
			return pressBindUpstream(tb, u, api.Name())
		}},
	}
	n := 0
	samples := map[string][]time.Duration{} // of each client's last run
	for _, cl := range clients {
		b.Run(cl.name, func(b *testing.B) {
			var took []time.Duration
			for i := 0; i < b.N; i++ {
				n++
				api := exampleapis.API{Group: fmt.Sprintf("bench%d.example.com", n), Plural: "things", Kind: "Thing", Exported: true}
				cl.offer(b, api)
				c, u := cl.start(b)
				pressed := cl.press(b, u, api)
				reached := createAndAwaitOnProvider(b, cl.consumer, cl.provider, api)
				if code := c.Wait(b, time.Minute); code != 0 {
					b.Fatalf("%s: exit %d", cl.name, code)
				}
				took = append(took, reached.Sub(pressed))
			}
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			b.ReportMetric(took[len(took)/2].Seconds(), "p50-s")
			b.ReportMetric(took[len(took)-1].Seconds(), "max-s")
			samples[cl.name] = took
		})
	}
	// Printed once every result line is out, not logged: a benchmark's
	// log keeps only 10 lines, which the browser's fill.
	for _, cl := range clients {
		fmt.Printf("%s: from pressing Bind to the object on the provider, sorted: %v\n", cl.name, samples[cl.name])
	}
}

// printedURL is the URL plain `kubectl-bind --skip-browser` prints.
func printedURL(tb testing.TB, c *procs.Command) string {
	tb.Helper()
	line := c.Line(tb, func(s string) bool { return strings.Contains(s, "Please manually open: ") })
	return line[strings.Index(line, "http"):]
}

// pressBind signs alice in at u (consenting at the identity provider, a
// fresh browser's first login there), picks api on our backend at server
// and presses Bind; it returns when Bind was pressed.
func pressBind(t testing.TB, u, server, api string) time.Time {
	t.Helper()
	br := chromium.OpenBindPage(t, u, server, alice)
	br.Click("input[value='" + api + "']")
	if br.Exists("#confirm") {
		br.Click("#confirm")
	}
	pressed := time.Now()
	br.ClickAndWait("button[value=bind]")
	return pressed
}

// createAndAwaitOnProvider creates an object of api in the consumer's
// namespace default as soon as the API is served there, and returns when
// it reached the provider.
func createAndAwaitOnProvider(tb testing.TB, consumer, provider *rest.Config, api exampleapis.API) time.Time {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	consumerDyn := dynamic.NewForConfigOrDie(consumer)
	providerDyn := dynamic.NewForConfigOrDie(provider)
	crds := apiextensionsclient.NewForConfigOrDie(consumer).ApiextensionsV1().CustomResourceDefinitions()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": api.Group + "/v1alpha1", "kind": api.Kind,
		"metadata": map[string]any{"name": "x", "namespace": "default"},
		"spec":     map[string]any{"tier": "gold"},
	}}
	for {
		if _, err := crds.Get(ctx, api.Name(), metav1.GetOptions{}); err == nil {
			_, err := consumerDyn.Resource(api.GVR()).Namespace("default").Create(ctx, obj, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
		}
		if ctx.Err() != nil {
			tb.Fatalf("%s was not served in the consumer cluster in time", api.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		list, err := providerDyn.Resource(api.GVR()).List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) > 0 {
			return time.Now()
		}
		if ctx.Err() != nil {
			tb.Fatalf("the %s object did not reach the provider in time", api.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
