package upgrade

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/chromium"
)

// alice may bind: only group "binders" may (backendproc.BrowserArgs).
var alice = oidcprovider.Alice

// bindInBrowser opens u, signs alice in, picks apis, confirms the code and
// presses Bind (the page of the previous release is the same as today's).
func bindInBrowser(t *testing.T, base, u string, apis ...string) {
	t.Helper()
	b := chromium.New(t)
	if status := b.Open(u); status != http.StatusOK {
		t.Fatalf("the URL led to status %d at %s", status, b.URL())
	}
	chromium.SignIn(t, b, alice)
	if !strings.HasPrefix(b.URL(), base+"/bind") {
		t.Fatalf("after login the browser is at %s:\n%s", b.URL(), b.Text("body"))
	}
	for _, a := range apis {
		b.Click("input[value='" + a + "']")
	}
	b.Click("#confirm")
	b.ClickAndWait("button[value=bind]")
}

// syncBothWays creates MangoDB name in the consumer's namespace default,
// waits for it on the provider, sets a status there and waits for it
// downstream; it returns the provider's copy.
func syncBothWays(ctx context.Context, t *testing.T, cDyn, pDyn dynamic.Interface, name string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mango.Group + "/" + mangoGVR.Version, "kind": mango.Kind,
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec":     map[string]any{"tier": "gold-" + name},
	}}
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "MangoDB "+name+" to be created in the consumer cluster", func() (bool, error) {
		_, err := cDyn.Resource(mangoGVR).Namespace("default").Create(ctx, obj, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), err
	})
	var up *unstructured.Unstructured
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "MangoDB "+name+" to reach the provider", func() (bool, error) {
		list, err := pDyn.Resource(mangoGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].GetName() == name {
				up = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if got := nested(up, "spec", "tier"); got != "gold-"+name {
		t.Errorf("MangoDB %s on the provider has spec.tier %q", name, got)
	}
	statusComesBack(ctx, t, cDyn, pDyn, up.GetNamespace(), name, "Ready-"+name)
	return up
}

// statusComesBack sets status.phase of MangoDB name in the provider's
// namespace upNS and waits until the consumer's copy shows it.
func statusComesBack(ctx context.Context, t *testing.T, cDyn, pDyn dynamic.Interface, upNS, name, phase string) {
	t.Helper()
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "the status of "+name+" to be written on the provider", func() (bool, error) {
		cur, err := pDyn.Resource(mangoGVR).Namespace(upNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_ = unstructured.SetNestedField(cur.Object, phase, "status", "phase")
		_, err = pDyn.Resource(mangoGVR).Namespace(upNS).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err == nil, err
	})
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "status "+phase+" of "+name+" to reach the consumer", func() (bool, error) {
		cur, err := cDyn.Resource(mangoGVR).Namespace("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return nested(cur, "status", "phase") == phase, nil
	})
}

// heartbeat is the ClusterBinding's status.lastHeartbeatTime (zero when
// unset).
func heartbeat(ctx context.Context, t *testing.T, pDyn dynamic.Interface, ns string) time.Time {
	t.Helper()
	s := nested(get(ctx, t, pDyn, clusterGVR, ns, "cluster"), "status", "lastHeartbeatTime")
	if s == "" {
		return time.Time{}
	}
	hb, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("lastHeartbeatTime %q: %v", s, err)
	}
	return hb
}

// heartbeatRenewed sets the heartbeat an hour back and waits until the
// konnector writes a new one. Both konnectors beat every 5 minutes
// (hard-coded) and renew a heartbeat older than half of that whenever the
// ClusterBinding changes, so a backdated one is renewed at once: the
// konnector's reconcile and status write still work, without waiting for
// the next beat.
func heartbeatRenewed(ctx context.Context, t *testing.T, pDyn dynamic.Interface, ns, who string) {
	t.Helper()
	backdated := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	patch := []byte(`{"status":{"lastHeartbeatTime":"` + backdated.Format(time.RFC3339) + `"}}`)
	if _, err := pDyn.Resource(clusterGVR).Namespace(ns).Patch(ctx, "cluster", types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("backdating the heartbeat: %v", err)
	}
	testutil.AwaitWithin(t, 2*time.Minute, 500*time.Millisecond, who+" to renew the heartbeat on the ClusterBinding", func() (bool, error) {
		return heartbeat(ctx, t, pDyn, ns).After(backdated.Add(30 * time.Minute)), nil
	})
}
