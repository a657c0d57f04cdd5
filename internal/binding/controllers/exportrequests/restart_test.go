package exportrequests_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A settled consumer costs no request on a restart of the controllers (a
// new leader): its export, BoundSchema, Role and RoleBinding are compared
// with the cache, not read or applied again. Only the cluster-wide lists
// and watches of the cache are made.
func TestRestartCostsSettledConsumerNoRequest(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "settled", mangodb)
	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request("mangodbs.mangodb.com", "mangodb.com", "mangodbs")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, "mangodbs.mangodb.com"); phase != exportrequests.PhaseSucceeded {
		t.Fatalf("request: %s %q", phase, msg)
	}
	testutil.Await(t, "the consumer's Role grants what it bound", func() bool {
		role, err := e.kube.RbacV1().Roles(c.namespace).Get(ctx, exportrequests.ConsumerExportsRole, metav1.GetOptions{})
		return err == nil && len(role.Rules) == 1
	})
	e.stop()

	// Every request the restarted controllers make about the consumer's
	// namespace (a cluster-wide list or watch names none).
	var (
		mu   sync.Mutex
		made []string
	)
	counted := rest.CopyConfig(e.backend)
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if p := r.URL.Path; strings.Contains(p+"/", "/namespaces/"+c.namespace+"/") {
				mu.Lock()
				made = append(made, r.Method+" "+p)
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	reconciled := make(chan struct{})
	var once sync.Once
	e.run(t, counted, kbmanager.Options{Reconciled: func(controller string, req reconcile.Request, err error) {
		if controller == "exports" && req.Name == c.namespace && err == nil {
			once.Do(func() { close(reconciled) })
		}
	}})
	select {
	case <-reconciled:
	case <-time.After(time.Minute):
		t.Fatal("the restarted controllers did not look at the consumer within a minute")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(made) > 0 {
		t.Errorf("the restart cost the settled consumer %d requests: %v", len(made), made)
	}
}

// A request created while the controllers work through a backlog (a new
// leader's first look at every consumer) is answered before the backlog
// is done: objects of the initial list wait behind new ones.
func TestNewRequestAnsweredDuringBacklog(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "urgent", mangodb)
	e.stop()

	// Consumers that each need a Role and a RoleBinding: at 10 requests/s
	// the backlog takes at least 2*backlog/10 seconds.
	const backlog = 100
	backlogPrefix := fmt.Sprintf("%sbacklog-%d-", prefix, time.Now().UnixNano()%1e6)
	for i := range backlog {
		name := fmt.Sprintf("%s%d", backlogPrefix, i)
		_, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{binding.LabelManagedBy: binding.ManagedByValue},
			Annotations: map[string]string{binding.AnnotationIssuer: issuer, binding.AnnotationSubject: name,
				binding.AnnotationCluster: "c1"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		if err := e.provisioner.GrantBackend(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	slow := rest.CopyConfig(e.backend)
	limiter := &openable{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(10, 1)}
	slow.RateLimiter = limiter
	// The backlog is not waited for at the end.
	defer limiter.open.Store(true)
	var (
		mu      sync.Mutex
		settled = map[string]bool{}
		once    sync.Once
	)
	working := make(chan struct{})
	e.run(t, slow, kbmanager.Options{Reconciled: func(controller string, req reconcile.Request, err error) {
		if controller == "exports" && strings.HasPrefix(req.Name, backlogPrefix) && err == nil {
			mu.Lock()
			settled[req.Name] = true
			mu.Unlock()
			once.Do(func() { close(working) })
		}
	}})
	select {
	case <-working:
	case <-time.After(time.Minute):
		t.Fatal("the controllers did not start on the backlog within a minute")
	}

	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request("mangodbs.mangodb.com", "mangodb.com", "mangodbs")); err != nil {
		t.Fatal(err)
	}
	phase, msg, took := c.waitPhase(t, "mangodbs.mangodb.com")
	if phase != exportrequests.PhaseSucceeded {
		t.Fatalf("request: %s %q", phase, msg)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("answered after %v, with %d of %d backlog consumers done", took.Round(time.Millisecond), len(settled), backlog)
	if len(settled) >= backlog {
		t.Errorf("the request was answered only after the whole backlog of %d consumers", backlog)
	}
}

// openable limits requests until it is opened.
type openable struct {
	flowcontrol.RateLimiter
	open atomic.Bool
}

func (o *openable) Wait(ctx context.Context) error {
	if o.open.Load() {
		return nil
	}
	return o.RateLimiter.Wait(ctx)
}

func (o *openable) TryAccept() bool { return o.open.Load() || o.RateLimiter.TryAccept() }
