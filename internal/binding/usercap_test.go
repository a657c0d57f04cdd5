package binding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cappedProvisioner is newProvisioner with a cap of max clusters per user.
func cappedProvisioner(t *testing.T, e env, max int) *Provisioner {
	t.Helper()
	cat := startCatalog(t, e.backend, ScopeNamespaced)
	p, err := NewProvisioner(e.backend, cat, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider", MaxClustersPerUser: max})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// liveUserNamespaces counts c's namespaces that are not being deleted, as
// an operator would: by the user label.
func liveUserNamespaces(t *testing.T, e env, c Consumer) []string {
	t.Helper()
	list, err := e.kube.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: LabelConsumerUser + "=" + UserLabel(c)})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			names = append(names, ns.Name)
		}
	}
	return names
}

// A user binds up to the cap; the next new cluster is refused with an
// error naming the cap, before anything is made for it; a rebind of a
// cluster of theirs still works at the cap; another user is not affected;
// a namespace made before the user label existed is counted by its
// annotations.
func TestClusterCapPerUser(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := cappedProvisioner(t, e, 3)
	c := Consumer{Issuer: issuer, Subject: "capped"}

	// A namespace of this user made before the label: annotations only.
	old := Consumer{Issuer: issuer, Subject: "capped"}
	oldName := p.Namespace(old, "old-cluster")
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:        oldName,
		Labels:      map[string]string{LabelManagedBy: managedByValue, LabelConsumerHash: identityHash(old, "old-cluster")},
		Annotations: map[string]string{AnnotationIssuer: issuer, AnnotationSubject: "capped", AnnotationCluster: "old-cluster"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := p.Provision(ctx, c, fmt.Sprintf("cluster-%d", i), []Resource{widgets}); err != nil {
			t.Fatalf("bind %d: %v", i, err)
		}
	}
	_, err := p.Provision(ctx, c, "cluster-2", []Resource{widgets})
	var capErr *ClusterCapError
	if !errors.As(err, &capErr) || !errors.Is(err, ErrClusterCap) || capErr.Cap != 3 || capErr.Have != 3 ||
		!strings.Contains(err.Error(), "at most 3 clusters per user") {
		t.Fatalf("the 4th cluster (the old namespace counted): got %v, want a ClusterCapError naming 3", err)
	}
	if _, err := e.kube.CoreV1().Namespaces().Get(ctx, p.Namespace(c, "cluster-2"), metav1.GetOptions{}); err == nil {
		t.Fatal("a namespace was made for the refused cluster")
	}
	if n := p.CapRefusals(); n != 1 {
		t.Fatalf("%d refusals counted, want 1", n)
	}
	// At the cap, a rebind of the old and of a new one still works.
	if _, err := p.Provision(ctx, c, "cluster-0", []Resource{widgets}); err != nil {
		t.Fatalf("rebind at the cap: %v", err)
	}
	if _, err := p.Provision(ctx, old, "old-cluster", []Resource{widgets}); err != nil {
		t.Fatalf("rebind of the namespace made before the label: %v", err)
	}
	// Another user of the same issuer, and the same subject at another
	// issuer, are other users.
	for _, other := range []Consumer{{Issuer: issuer, Subject: "capped-other"}, {Issuer: issuer + "/other", Subject: "capped"}} {
		if _, err := p.Provision(ctx, other, "cluster-2", []Resource{widgets}); err != nil {
			t.Fatalf("%s: %v", other.ID(), err)
		}
	}
	// Unbinding one frees its place.
	if err := p.Unbind(ctx, c, "cluster-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Provision(ctx, c, "cluster-2", []Resource{widgets}); err != nil {
		t.Fatalf("after an unbind: %v", err)
	}
	if n := len(liveUserNamespaces(t, e, c)); n != 2 { // + the old, unlabelled one
		t.Fatalf("%d labelled namespaces, want 2", n)
	}
}

// Binds of one user's new clusters that run at once (as on several
// replicas) all pass the check before any creates: those that find more
// than the cap once made roll their own namespace back, so no more than
// the cap stay, and every other bind is refused with the cap.
func TestClusterCapConcurrent(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const max, binds = 2, 8
	// Two provisioners: two replicas.
	ps := []*Provisioner{cappedProvisioner(t, e, max), cappedProvisioner(t, e, max)}
	c := Consumer{Issuer: issuer, Subject: "concurrent-capped"}
	var wg sync.WaitGroup
	errs := make([]error, binds)
	for i := range binds {
		wg.Go(func() {
			_, errs[i] = ps[i%2].Provision(ctx, c, fmt.Sprintf("cluster-%d", i), []Resource{widgets})
		})
	}
	wg.Wait()
	ok := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, ErrClusterCap):
			t.Errorf("bind %d: %v, want success or the cap", i, err)
		}
	}
	live := liveUserNamespaces(t, e, c)
	if n := ps[0].CapRefusals() + ps[1].CapRefusals(); n != int64(binds-ok) {
		t.Errorf("%d refusals counted, %d binds refused", n, binds-ok)
	}
	if len(live) > max || ok > max || ok != len(live) {
		t.Fatalf("%d binds succeeded, %d namespaces stay (%v); want at most %d, one per success", ok, len(live), live, max)
	}
	// Whatever stayed is a whole binding.
	for _, ns := range live {
		if _, err := e.kube.CoreV1().Secrets(ns).Get(ctx, KubeconfigSecretName, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace %s stayed without its kubeconfig: %v", ns, err)
		}
	}
	t.Logf("%d concurrent binds of new clusters, cap %d: %d succeeded", binds, max, ok)
}

// A namespace bound with a cluster ID the backend issued and the client
// proved (the poll flow) is never reached by a CLI token naming the same
// cluster ID; the same user's proven rebind, or a bind after signing in,
// still reaches it. The identity includes the subject: another user
// naming the same cluster ID gets a namespace of their own.
func TestClusterIssuedNotReachedByToken(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	proven := Consumer{Issuer: issuer, Subject: "poll-user", Proof: ProofIssued}
	res, err := p.Provision(ctx, proven, "abcdefghijklmnopqrstuvwxyz", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	token := Consumer{Issuer: issuer, Subject: "poll-user", Proof: ProofToken}
	if _, err := p.Provision(ctx, token, "abcdefghijklmnopqrstuvwxyz", []Resource{widgets}); !errors.Is(err, ErrClusterNotProven) {
		t.Fatalf("rebind with a CLI token: got %v, want ErrClusterNotProven", err)
	}
	login := Consumer{Issuer: issuer, Subject: "poll-user", Proof: ProofLogin}
	if r, err := p.Provision(ctx, login, "abcdefghijklmnopqrstuvwxyz", []Resource{widgets}); err != nil || r.Namespace != res.Namespace {
		t.Fatalf("rebind after signing in (callback flow): %v %v", r, err)
	}
	again, err := p.Provision(ctx, proven, "abcdefghijklmnopqrstuvwxyz", []Resource{widgets})
	if err != nil || again.Namespace != res.Namespace {
		t.Fatalf("proven rebind: %v %v", again, err)
	}
	other, err := p.Provision(ctx, Consumer{Issuer: issuer, Subject: "someone-else", Proof: ProofToken}, "abcdefghijklmnopqrstuvwxyz", []Resource{widgets})
	if err != nil || other.Namespace == res.Namespace {
		t.Fatalf("another user with the same cluster ID: %v %v", other, err)
	}
}
