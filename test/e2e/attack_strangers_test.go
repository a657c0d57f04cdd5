package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/sessions/kube"
	"github.com/kbprovider/backend/pkg/protocol"
)

// strangerSessions is how many anonymous sessions the attack makes.
const strangerSessions = 20

// TestAttackStrangersWriteNothing
//
// Attacker: anybody, without an account at the identity provider. For each
// of 20 sessions: POST /sessions, GET of the signed authorize link the
// client computes itself, then the forged GET /callback?error=access_denied
// with the state from the redirect and the browser cookie it got, against a
// backend that keeps sessions as Secrets in the provider cluster
// (--session-store=ring), with no per-client pace to hide behind.
//
// Stopped by: nothing is written before a user signed in at the identity
// provider. The link's nonce travels in the signed login state and is spent
// at the callback after a sign-in; the login state is spent only after the
// code exchange and the ID-token check; a callback that signs nobody in
// records no mark and no denial. A legitimate bind afterwards works.
func TestAttackStrangersWriteNothing(t *testing.T) {
	bob := binder("bob-strangers") // of its own: no other test's namespaces
	e, records := startRecordsEnv(t, []oidcprovider.User{bob}, "--session-create-rate", "0")
	namespacesBefore := e.providerNamespaces(t)

	for i := range strangerSessions {
		raw := e.createRawSession(t, "")
		client := noRedirectJar(t)
		resp, body := send(t, client, raw.authURL(t, nil))
		loc, _ := url.Parse(resp.Header.Get("Location"))
		state := loc.Query().Get("state")
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc.String(), e.idp.IssuerURL) || state == "" {
			t.Fatalf("session %d: the link answered %d to %q, want 303 to the identity provider with a state:\n%s", i, resp.StatusCode, loc, body)
		}
		forged := e.baseURL + "/callback?" + url.Values{"error": {"access_denied"}, "state": {state}}.Encode()
		resp, body = send(t, client, forged)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "Nothing was recorded") {
			t.Fatalf("session %d: forged error callback answered %d, want 403 saying nothing was recorded:\n%s", i, resp.StatusCode, body)
		}
	}
	// The records are read from the API server, not from any cache.
	written := records.count(t)
	t.Logf("session-record Secrets written by %d anonymous sessions: %d (%.1f per session)", strangerSessions, written, float64(written)/strangerSessions)
	if written != 0 {
		t.Errorf("%d session-record Secrets after %d anonymous sessions, want 0", written, strangerSessions)
	}
	if after := e.providerNamespaces(t); after != namespacesBefore {
		t.Errorf("provider namespaces: %d before the attack, %d after", namespacesBefore, after)
	}

	// The control: a user who signs in binds as ever, and that bind does
	// write the records the attack could not (the count above looked in
	// the right place).
	raw := e.createRawSession(t, "")
	client, form := e.loginToSelection(t, raw.authURL(t, nil), bob)
	if status, body := e.post(t, client, form, nil); status != http.StatusOK {
		t.Fatalf("bind after the attack: %d\n%s", status, body)
	}
	if br := raw.poll(t); len(br.Kubeconfig) == 0 {
		t.Fatal("the bind after the attack delivered no kubeconfig")
	}
	// The link's nonce, the login state, the outcome, the first delivery.
	if n := records.count(t); n != 4 {
		t.Errorf("a bind wrote %d session-record Secrets, want 4", n)
	}
	if ns := e.consumerNamespaces(t, bob); len(ns) != 1 {
		t.Errorf("bob's provider namespaces after the bind: %v, want one", ns)
	}
}

// TestAttackSessionWriteBudget
//
// Attacker: signed-in users (or one with many logins) who make the backend
// write session records faster than the provider cluster should hold them.
//
// Stopped by: the store's write budget (--session-write-rate, a token
// bucket per replica): past it a write fails at once, writes nothing and
// the request gets 503 with Retry-After; nothing queues. Here the budget is
// one record per 100 s: the first sign-in spends it on its login state, its
// link's nonce is refused, and so is the next sign-in's state.
func TestAttackSessionWriteBudget(t *testing.T) {
	bob := binder("bob-write-budget") // of its own: no other test's namespaces
	e, records := startRecordsEnv(t, []oidcprovider.User{bob}, "--session-write-rate", "0.01")
	namespacesBefore := e.providerNamespaces(t)
	raw := e.createRawSession(t, "")
	link := raw.authURL(t, nil)
	for i := range 2 {
		client := newJarClient(t)
		callback, err := e.idp.Login(context.Background(), client, link, bob.Name, bob.Password)
		if err != nil {
			t.Fatal(err)
		}
		resp, body := send(t, client, callback.String())
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "try again") {
			t.Fatalf("sign-in %d past the write budget: %d (Retry-After %q), want 503 with Retry-After:\n%s", i+1, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	if n := records.count(t); n != 1 {
		t.Errorf("%d session-record Secrets, want 1: the budget's burst", n)
	}
	if after := e.providerNamespaces(t); after != namespacesBefore {
		t.Errorf("provider namespaces: %d before, %d after the refused sign-ins", namespacesBefore, after)
	}
	// The session is not lost: its poll says pending.
	resp, body := send(t, http.DefaultClient, raw.signedPollURL(t))
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "authorization_pending") {
		t.Errorf("poll after the refused writes: %d, want 403 authorization_pending:\n%s", resp.StatusCode, body)
	}
}

// sessionRecords counts the session-record Secrets of one namespace.
type sessionRecords struct {
	kube kubernetes.Interface
	ns   string
}

func (r sessionRecords) count(t *testing.T) int {
	t.Helper()
	list, err := r.kube.CoreV1().Secrets(r.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.RecordLabel})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// startRecordsEnv starts a backend whose session store writes Secrets in
// the provider cluster (a ring of one replica, in a namespace of its
// own), with args added.
func startRecordsEnv(t *testing.T, users []oidcprovider.User, args ...string) (*env, sessionRecords) {
	t.Helper()
	cp := controlplane.Get(t)
	admin := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	ns := fmt.Sprintf("kb-records-%d", time.Now().UnixNano()%1e9)
	if _, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	store := []string{
		"--session-store", "ring",
		"--session-namespace", ns,
		"--peer-listen-address", fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t)),
		"--peer-key", procs.RandomKey(32),
	}
	e := startEnv(t, backendOptions{extraArgs: append(store, args...), users: users})
	return e, sessionRecords{kube: admin, ns: ns}
}

// providerNamespaces counts the namespaces the backend makes for consumers.
func (e *env) providerNamespaces(t *testing.T) int {
	t.Helper()
	list, err := e.kube.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ns := range list.Items {
		if strings.HasPrefix(ns.Name, namespacePrefix) {
			n++
		}
	}
	return n
}

// signedPollURL signs a poll of the session with a fresh nonce.
func (s *rawSession) signedPollURL(t *testing.T) string {
	t.Helper()
	u, _ := url.Parse(s.e.baseURL + "/poll")
	signed, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return signed.String()
}

// noRedirectJar is a client with cookies that stops at each redirect.
func noRedirectJar(t *testing.T) *http.Client {
	c := newJarClient(t)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

// send GETs u and returns the answer and its body.
func send(t *testing.T, client *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}
