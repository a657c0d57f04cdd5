package replicas

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
)

var (
	alice = oidcprovider.User{Name: "alice", Password: "alice-pw", Email: "alice@example.com", Groups: []string{"binders"}}
)

// expect fails the test unless the answer has the status and error code.
func expect(t *testing.T, what string, a pollAnswer, status int, code string) {
	t.Helper()
	if a.status != status || a.code != code {
		t.Fatalf("%s: %s; want %d %s\nbody: %s", what, a, status, code, a.body)
	}
	t.Logf("%s: %s", what, a)
}

// TestThreeReplicas runs three backend processes sharing sessions in a
// static hashring behind one external URL: a session created on one
// replica, the browser part through another, polls spread over all three;
// then the owner of the session dies and its sessions go on at their
// backups.
func TestThreeReplicas(t *testing.T) {
	cp := controlplane.Get(t)
	prepareCluster(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	reps := []*replica{newReplica(t, "replica-0"), newReplica(t, "replica-1"), newReplica(t, "replica-2")}
	f := newFront(t, reps...)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{f.url + "/callback"}, Users: []oidcprovider.User{alice}})
	peerKeyB64 := procs.RandomKey(t, 32)
	peerKey := writeFile(t, "peer-key", peerKeyB64+"\n")
	signKey, encKey, clusterKey := procs.RandomKey(t, 64), procs.RandomKey(t, 32), procs.RandomKey(t, 32)
	t.Cleanup(func() {
		for _, r := range reps {
			for name, secret := range map[string]string{"peer key": peerKeyB64, "cookie signing key": signKey, "cookie encryption key": encKey, "cluster secret key": clusterKey} {
				if strings.Contains(r.logs.String(), secret) {
					t.Errorf("the logs of %s contain the %s", r.name, name)
				}
			}
		}
	})
	peers := peerURLs(reps)
	for _, r := range reps {
		r.args = append(r.hashringArgs(peerKey),
			"--peers", strings.Join(peers, ","),
			"--external-url", f.url,
			"--oidc-issuer-url", idp.IssuerURL,
			"--oidc-issuer-client-id", idp.ClientID,
			"--oidc-issuer-client-secret", idp.ClientSecret,
			"--oidc-allowed-groups", "binders",
			"--cookie-signing-key", signKey,
			"--cookie-encryption-key", encKey,
			"--cluster-secret-key", clusterKey,
			"--kubeconfig", cp.AdminKubeconfigPath(),
			"--namespace-prefix", namespacePrefix,
		)
		r.start(t)
	}
	for _, r := range reps {
		r.waitReady(t)
	}
	ring := newOwnerRing(t, peers[0])
	ownerOf := func(id string) *replica {
		o := ring.owner(peers, id)
		for _, r := range reps {
			if r.peerURL == o {
				return r
			}
		}
		t.Fatalf("owner %s of %s is no replica", o, id)
		return nil
	}

	// The session is created on replica 0; its state lives on its owner.
	s := mustCreate(t, reps[0], f.url, "")
	owner := ownerOf(s.SessionID)
	t.Logf("session %s created on %s, owned by %s", s.SessionID, reps[0].name, owner.name)

	// Polls spread over the replicas: pending on one, too soon on another
	// (the interval is kept cluster-wide), the first poll's nonce replayed
	// on a third is refused, and the next poll is pending again.
	first := s.signedPoll(t)
	expect(t, "first poll on replica-1", send(t, reps[1], first), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	soon := send(t, reps[2], s.signedPoll(t))
	expect(t, "poll at once on replica-2", soon, http.StatusTooManyRequests, v1alpha1.ErrorSlowDown)
	if soon.retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", soon.retryAfter)
	}
	time.Sleep(pollInterval + 100*time.Millisecond)
	expect(t, "replayed nonce on replica-2", send(t, reps[2], first), http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature)
	expect(t, "poll on replica-0", send(t, reps[0], s.signedPoll(t)), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)

	// The browser part goes through replica 1 only.
	f.pin(reps[1])
	if code := bindInBrowser(t, ctx, idp, f, s, alice); code != http.StatusOK {
		t.Fatalf("bind through replica-1 answered %d", code)
	}
	for _, r := range reps {
		t.Logf("front sent %d browser requests to %s", f.hits[r.name].Load(), r.name)
		if got := f.hits[r.name].Load(); (r == reps[1]) != (got > 0) {
			t.Errorf("%s got %d browser requests", r.name, got)
		}
	}
	// The signed authentication URL was used once, cluster-wide: its nonce
	// is spent on the owner, so opening it again on another replica fails.
	if resp, err := http.Get(strings.Replace(s.authURL(t), f.url, "http://"+reps[2].addr, 1)); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusFound {
			t.Errorf("a fresh authentication URL on replica-2 after the bind: %d (the session is done)", resp.StatusCode)
		}
	}

	// Done: the poll on replica 2 gets the BindingResponse, and so does a
	// later one on replica 0 within the grace period.
	time.Sleep(pollInterval + 100*time.Millisecond)
	done := send(t, reps[2], s.signedPoll(t))
	if done.status != http.StatusOK {
		t.Fatalf("poll on replica-2 after the bind: %s\n%s", done, done.body)
	}
	var br v1alpha1.BindingResponse
	if err := json.Unmarshal(done.body, &br); err != nil {
		t.Fatal(err)
	}
	res, err := pollclient.ValidateBindingResponse(&br, s.SessionID)
	if err != nil {
		t.Fatalf("BindingResponse: %v", err)
	}
	namespace := res.Namespace
	if !strings.HasPrefix(namespace, namespacePrefix) {
		t.Fatalf("provider namespace %q", namespace)
	}
	t.Logf("poll on replica-2: 200, provider namespace %s", namespace)
	time.Sleep(pollInterval + 100*time.Millisecond)
	if again := send(t, reps[0], s.signedPoll(t)); again.status != http.StatusOK || string(again.body) != string(done.body) {
		t.Fatalf("poll on replica-0 in the grace period: %s", again)
	}

	// Mid-flow, the session's owner dies. Before that, pending sessions
	// owned by every replica.
	owned := map[*replica][]*session{}
	for i := 0; len(owned) < 3 || len(owned[owner]) < 2; i++ {
		if i == 60 {
			t.Fatalf("60 sessions and still not two on each replica: %v", owned)
		}
		p := mustCreate(t, reps[i%3], f.url, "")
		owned[ownerOf(p.SessionID)] = append(owned[ownerOf(p.SessionID)], p)
	}
	var survivors []*replica
	for _, r := range reps {
		if r != owner {
			survivors = append(survivors, r)
		}
	}
	// One of its sessions is in the middle of the browser part: logged
	// in, on the selection page (served by a survivor).
	mid := owned[owner][0]
	owned[owner] = owned[owner][1:]
	f.pin(survivors[0])
	sel := openSelection(t, ctx, idp, f, mid, alice)

	owner.kill(t)
	t.Logf("killed %s", owner.name)

	// The session in the middle of the browser part goes on at the dead
	// owner's backup: Bind completes it, its namespace is provisioned and
	// its poll gets the response.
	status, page := sel.bind(t, ctx)
	if status != http.StatusOK || !strings.Contains(strings.ToLower(page), "terminal") {
		t.Errorf("bind after the owner died: %d\n%s", status, page)
	}
	nss, err := kubernetes.NewForConfigOrDie(cp.AdminConfig()).CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	provisioned := false
	for _, n := range nss.Items {
		provisioned = provisioned || n.Annotations[binding.AnnotationCluster] == mid.ClusterID
	}
	if !provisioned {
		t.Errorf("no namespace provisioned for the session bound after its owner died")
	}
	if a := send(t, survivors[1], mid.signedPoll(t)); a.status != http.StatusOK {
		t.Errorf("poll of the session bound after its owner died: %s", a)
	}

	// Its other sessions go on at once from every survivor: the completed
	// one still answers its response within the grace period, the pending
	// ones stay pending. The survivors' own sessions carry on.
	for _, r := range survivors {
		time.Sleep(pollInterval + 100*time.Millisecond) // s was polled just before
		for _, p := range owned[owner] {
			a := send(t, r, p.signedPoll(t))
			expect(t, fmt.Sprintf("%s: pending session of the dead owner", r.name), a, http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
			if a.took > 3*time.Second {
				t.Errorf("the answer took %s", a.took)
			}
		}
		if a := send(t, r, s.signedPoll(t)); a.status != http.StatusOK || string(a.body) != string(done.body) {
			t.Errorf("%s: completed session of the dead owner in the grace period: %s", r.name, a)
		}
	}
	time.Sleep(pollInterval + 100*time.Millisecond)
	for i, r := range survivors {
		if i > 0 {
			time.Sleep(pollInterval + 100*time.Millisecond)
		}
		for _, o := range survivors {
			for _, p := range owned[o] {
				expect(t, fmt.Sprintf("%s: session of live %s", r.name, o.name), send(t, r, p.signedPoll(t)), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
			}
		}
	}
	for _, r := range survivors {
		if code, body, _ := r.readyz(); code != http.StatusOK {
			t.Errorf("%s not ready after a peer died: %d %s", r.name, code, body)
		}
	}

	// Nothing provisioned is lost: the client starts over with its
	// clusterID, proves it with the cluster secret it was given (any
	// replica checks the proof: they share --cluster-secret-key), binds
	// again through another survivor and lands in the same provider
	// namespace.
	s2 := mustCreate(t, survivors[0], f.url, s.ClusterID)
	if s2.ClusterID != s.ClusterID {
		t.Fatalf("clusterID %q, want %q", s2.ClusterID, s.ClusterID)
	}
	s2.clusterSecret = s.ClusterSecret
	f.pin(survivors[1])
	if code := bindInBrowser(t, ctx, idp, f, s2, alice); code != http.StatusOK {
		t.Fatalf("second bind answered %d", code)
	}
	done = send(t, survivors[0], s2.signedPoll(t))
	if done.status != http.StatusOK {
		t.Fatalf("poll after the second bind: %s", done)
	}
	var br2 v1alpha1.BindingResponse
	json.Unmarshal(done.body, &br2)
	res2, err := pollclient.ValidateBindingResponse(&br2, s2.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Namespace != namespace {
		t.Fatalf("after starting over: provider namespace %q, want the same %q", res2.Namespace, namespace)
	}
	t.Logf("started over on %s, bound through %s: same namespace %s", survivors[0].name, survivors[1].name, namespace)
}

// TestReplicaJoinsByDiscovery finds peers from the EndpointSlices of a
// headless Service on the real API server: a replica added later joins
// the ring of the running ones without restarts.
func TestReplicaJoinsByDiscovery(t *testing.T) {
	cp := controlplane.Get(t)
	kube := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, svc = "replicas-discovery", "backend-peers"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	// A headless Service without a selector: the test writes its
	// EndpointSlices, one per replica (each replica has its own port here).
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "peer", Port: 8091}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server refuses loopback addresses in EndpointSlices, so the
	// replicas' peer APIs listen on an address of this machine.
	ip := hostIPv4(t)
	publish := func(r *replica) {
		t.Helper()
		var port int32
		fmt.Sscanf(r.peerURL[strings.LastIndex(r.peerURL, ":")+1:], "%d", &port)
		_, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svc + "-" + r.name, Labels: map[string]string{
				discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "replicas-test",
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("peer"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("EndpointSlice of %s: %v", r.name, err)
		}
	}

	peerKey := writeFile(t, "peer-key", procs.RandomKey(t, 48))
	reps := []*replica{newReplica(t, "replica-0"), newReplica(t, "replica-1"), newReplica(t, "replica-2")}
	ext := "http://" + reps[0].addr
	for _, r := range reps {
		// The peer API listens on the machine's address, as a pod's
		// on its pod IP; the self URL is derived from it.
		r.peerURL = strings.Replace(r.peerURL, "127.0.0.1", ip, 1)
		r.args = append(r.hashringArgs(peerKey),
			"--peer-service", ns+"/"+svc, "--peer-port-name", "peer",
			"--kubeconfig", cp.AdminKubeconfigPath(),
			"--external-url", ext)
	}

	// A replica that cannot reach the API server serves, but is not
	// ready: it knows no peers yet.
	lost := newReplica(t, "lost")
	unreachable := writeFile(t, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, procs.FreePort(t)))
	lost.args = append(lost.hashringArgs(peerKey), "--peer-service", ns+"/"+svc, "--kubeconfig", unreachable)
	lost.start(t)

	publish(reps[0])
	publish(reps[1])
	reps[0].start(t)
	reps[1].start(t)
	reps[0].waitReady(t)
	reps[1].waitReady(t)

	code, body, err := lost.readyz()
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "peers") || !strings.Contains(body, "none known yet") {
		t.Errorf("/readyz of a replica without peers: %d %q %v", code, body, err)
	}
	t.Logf("/readyz of a replica that cannot reach the API server: %d\n%s", code, body)
	if c, _ := createSession(t, lost, "http://"+lost.addr, ""); c != http.StatusCreated {
		t.Errorf("a replica without peers does not serve sessions: %d", c)
	}

	two := []string{reps[0].peerURL, reps[1].peerURL}
	three := append(append([]string{}, two...), reps[2].peerURL)
	ring := newOwnerRing(t, reps[0].peerURL)

	// Sessions made in the ring of two, on either replica.
	var before []*session
	for i := 0; i < 12; i++ {
		before = append(before, mustCreate(t, reps[i%2], ext, ""))
	}
	for i, p := range before {
		expect(t, "ring of two", send(t, reps[(i+1)%2], p.signedPoll(t)), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	}

	// Replica 2 starts and appears in the Service.
	reps[2].start(t)
	publish(reps[2])
	reps[2].waitReady(t)
	for _, r := range reps[:2] {
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(r.logs.String(), reps[2].peerURL) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not learn of %s:\n%s", r.name, reps[2].name, r.logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(pollInterval) // and the next polls are not too soon

	// Sessions whose owner moved to the new replica go with it (taken
	// from the previous owner); the others carry on, from any replica.
	moved := 0
	for _, p := range before {
		a := send(t, reps[2], p.signedPoll(t))
		if ring.owner(two, p.SessionID) != ring.owner(three, p.SessionID) {
			moved++
			expect(t, "moved session on replica-2", a, http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
		} else {
			expect(t, "unmoved session on replica-2", a, http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
		}
	}
	t.Logf("%d of %d sessions moved to the new replica", moved, len(before))

	// New sessions are spread over all three, and every replica agrees
	// where they are: those owned by the new replica go on at their
	// backups when it dies.
	var onNew, onOld []*session
	for i := 0; len(onNew) < 2 || len(onOld) < 2; i++ {
		if i == 60 {
			t.Fatal("60 sessions and still not two on the new replica")
		}
		p := mustCreate(t, reps[i%3], ext, "")
		if ring.owner(three, p.SessionID) == reps[2].peerURL {
			onNew = append(onNew, p)
		} else {
			onOld = append(onOld, p)
		}
	}
	for _, r := range reps {
		for _, p := range append(append([]*session{}, onNew...), onOld...) {
			expect(t, r.name+": new session", send(t, r, p.signedPoll(t)), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
		}
		time.Sleep(pollInterval + 100*time.Millisecond)
	}
	reps[2].kill(t)
	for _, p := range onNew {
		expect(t, "session of the new replica after it died", send(t, reps[0], p.signedPoll(t)), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	}
	for _, p := range onOld {
		expect(t, "session of an old replica after the new one died", send(t, reps[1], p.signedPoll(t)), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	}
	reps[0].stop(t)
}

// hostIPv4 returns a non-loopback IPv4 address of this machine.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatalf("no non-loopback IPv4 address on this machine (interfaces: %v): the discovery test needs one for EndpointSlices", addrs)
	return ""
}
