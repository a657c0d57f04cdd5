package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// binder is a user of the identity provider that may bind (group binders).
func binder(name string) oidcprovider.User {
	return oidcprovider.User{Name: name, Password: name + "-pw", Email: name + "@example.com", Groups: []string{"binders"}}
}

// unpaced lets every request with a CLI token through, so that a test sees
// what is behind the pacing.
var unpaced = []string{"--cli-token-request-rate=0", "--cli-token-bind-rate=0"}

// cliLogin is `kubectl bind login` as the released CLI does it: GET
// /api/authorize with its localhost callback, the login at the identity
// provider, and the token from the redirect to the callback.
func (e *env) cliLogin(t *testing.T, user oidcprovider.User) string {
	t.Helper()
	got := make(chan url.Values, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.URL.Query():
		default:
		}
		io.WriteString(w, "logged in")
	}))
	defer cb.Close()
	q := url.Values{"redirect_url": {cb.URL + "/callback"}, "session_id": {"cli-session"}, "client_type": {"cli"}}
	client := newJarClient(t)
	callback, err := e.idp.Login(context.Background(), client, e.baseURL+"/api/authorize?"+q.Encode(), user.Name, user.Password)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := e.get(t, client, callback.String()); status != http.StatusOK {
		t.Fatalf("CLI login callback: %d %s", status, body)
	}
	select {
	case v := <-got:
		if v.Get("access_token") == "" {
			t.Fatalf("the CLI callback got no token: %v", v)
		}
		return v.Get("access_token")
	case <-time.After(10 * time.Second):
		t.Fatal("the CLI callback was never called")
	}
	return ""
}

// apiResult is an answer of a bearer route.
type apiResult struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
}

func (r apiResult) apiError(t *testing.T) v1alpha2.Error {
	t.Helper()
	var e v1alpha2.Error
	if err := json.Unmarshal(r.body, &e); err != nil || e.Kind != v1alpha2.KindError || e.Message == "" {
		t.Fatalf("%d is not a v1alpha2 error: %s", r.status, r.body)
	}
	return e
}

// apiDo calls a bearer route with token.
func (e *env) apiDo(t *testing.T, method, path, token string, body []byte) apiResult {
	t.Helper()
	req, _ := http.NewRequest(method, e.baseURL+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return apiResult{status: resp.StatusCode, header: resp.Header, body: raw, took: time.Since(start)}
}

// apiBind is POST /api/bind of the mangodbs template as clusterIdentity.
func (e *env) apiBind(t *testing.T, token, clusterIdentity string) apiResult {
	t.Helper()
	body := fmt.Sprintf(`{"apiVersion":"kube-bind.io/v1alpha2","kind":"BindableResourcesRequest","metadata":{"name":"mangodbs"},`+
		`"spec":{"templateRef":{"name":"mangodbs.mangodb.com"},"clusterIdentity":{"identity":%q}}}`, clusterIdentity)
	return e.apiDo(t, http.MethodPost, "/api/bind", token, []byte(body))
}

// boundNamespace is the provider namespace of a successful bind's response.
func boundNamespace(t *testing.T, r apiResult) (kubeconfig []byte, namespace string) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("bind: %d %s", r.status, r.body)
	}
	var resp v1alpha2.BindingResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	_, ns := kubeconfigNamespace(t, resp.Kubeconfig)
	return resp.Kubeconfig, ns
}

// tokenSecrets counts the token Secrets of a provider namespace: one per
// credential handed out.
func (e *env) tokenSecrets(t *testing.T, ns string) int {
	t.Helper()
	list, err := e.kube.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: binding.LabelCredential + "=" + binding.CredentialToken})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// liveNamespaces are a user's provider namespaces not being deleted.
func (e *env) liveNamespaces(t *testing.T, user oidcprovider.User) []string {
	t.Helper()
	var live []string
	for _, name := range e.consumerNamespaces(t, user) {
		ns, err := e.kube.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ns.DeletionTimestamp == nil {
			live = append(live, name)
		}
	}
	return live
}

// TestAttackUnboundedNamespacesFromOneToken floods POST /api/bind.
//
// Attacker: one user with one CLI token sends 150 POST /api/bind with
// distinct made-up clusterIdentity values, to make a provider namespace
// (ServiceAccount, RoleBinding, quota, Secrets, ClusterBinding) for each
// and exhaust the leader's memory; then tries a new cluster through the
// poll flow too. Stopped by: the provisioner's cap of namespaces per user
// (--max-clusters-per-user, 10 by default), counted from the provider
// cluster before a namespace is made: the 11th and later get 403 in the
// v1alpha2 error format naming the cap, nothing is made for them, and the
// poll session is denied with the same words.
func TestAttackUnboundedNamespacesFromOneToken(t *testing.T) {
	eve := binder("cap-eve")
	diag := backendproc.DiagnosticsArgs(t)
	e := startEnv(t, backendOptions{extraArgs: append(diag, unpaced...), users: []oidcprovider.User{eve}})
	token := e.cliLogin(t, eve)

	const binds, maxClusters = 150, binding.DefaultMaxClustersPerUser
	var refusals []time.Duration
	start := time.Now()
	ok := 0
	for i := range binds {
		r := e.apiBind(t, token, fmt.Sprintf("made-up-cluster-%03d", i))
		switch r.status {
		case http.StatusOK:
			ok++
		case http.StatusForbidden:
			if msg := r.apiError(t); msg.Code != v1alpha2.ErrorAuthorizationFailed ||
				!strings.Contains(msg.Message, fmt.Sprintf("at most %d clusters per user", maxClusters)) {
				t.Fatalf("bind %d refused with %+v, want the cap named", i, msg)
			}
			refusals = append(refusals, r.took)
		default:
			t.Fatalf("bind %d: %d %s", i, r.status, r.body)
		}
	}
	elapsed := time.Since(start)
	live := e.liveNamespaces(t, eve)
	if ok != maxClusters || len(live) != maxClusters || len(refusals) != binds-maxClusters {
		t.Fatalf("%d binds succeeded, %d refused, %d namespaces; want %d, %d, %d", ok, len(refusals), len(live), maxClusters, binds-maxClusters, maxClusters)
	}
	slices.Sort(refusals)
	t.Logf("one user: %d of %d binds made a namespace; %d refused naming the cap; refusal median %s, max %s; all %d binds in %s",
		ok, binds, len(refusals), refusals[len(refusals)/2].Round(time.Millisecond), refusals[len(refusals)-1].Round(time.Millisecond),
		binds, elapsed.Round(time.Millisecond))

	// A rebind of one of the user's clusters still works at the cap.
	if r := e.apiBind(t, token, "made-up-cluster-000"); r.status != http.StatusOK {
		t.Fatalf("rebind at the cap: %d %s", r.status, r.body)
	}

	// The poll flow's new cluster ID: the page says why, 403, and the
	// client's poll is denied with the same words.
	s, authURL := e.newSession(t)
	client, form := e.loginToSelection(t, authURL, eve)
	status, body := e.post(t, client, form, nil)
	expectPage(t, status, body, http.StatusForbidden, fmt.Sprintf("at most %d clusters per user", maxClusters))
	e.expectDenied(t, s, fmt.Sprintf("at most %d clusters per user", maxClusters))
	if n := len(e.liveNamespaces(t, eve)); n != maxClusters {
		t.Fatalf("%d namespaces after the poll-flow attempt, want %d", n, maxClusters)
	}
	if n := metricSum(t, "http://"+diag[1], "kube_bind_backend_cluster_cap_refusals_total"); n != binds-maxClusters+1 {
		t.Errorf("kube_bind_backend_cluster_cap_refusals_total %d, want %d", n, binds-maxClusters+1)
	}
}

// TestAttackCLITokenWithAnotherUsersClusterIdentity binds as someone
// else's cluster.
//
// Attacker: a user who learnt another user's cluster identity (the UID of
// its kube-system namespace, no secret) binds with their own CLI token
// and that clusterIdentity, hoping for the other user's namespace and a
// credential for it. Stopped by: the consumer identity is (issuer,
// subject, cluster): the attacker gets a namespace of their own, the
// victim's namespace gets no new credential, and the attacker's
// credential cannot read it.
func TestAttackCLITokenWithAnotherUsersClusterIdentity(t *testing.T) {
	victim, attacker := binder("ident-victim"), binder("ident-attacker")
	e := startEnv(t, backendOptions{extraArgs: unpaced, users: []oidcprovider.User{victim, attacker}})
	const uid = "3f1c7a52-9d4e-4b8a-a0f2-6c9e5d1b7a40"
	victimKubeconfig, victimNS := boundNamespace(t, e.apiBind(t, e.cliLogin(t, victim), uid))
	tokensBefore := e.tokenSecrets(t, victimNS)

	attackerKubeconfig, attackerNS := boundNamespace(t, e.apiBind(t, e.cliLogin(t, attacker), uid))
	if attackerNS == victimNS {
		t.Fatalf("the attacker's bind went to the victim's namespace %s", victimNS)
	}
	if n := e.tokenSecrets(t, victimNS); n != tokensBefore {
		t.Fatalf("the victim's namespace has %d token Secrets after the attack, %d before", n, tokensBefore)
	}
	kube, _ := kubeconfigNamespace(t, attackerKubeconfig)
	if _, err := kube.CoreV1().Secrets(victimNS).List(context.Background(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the attacker's credential listing the victim's Secrets: %v, want forbidden", err)
	}
	victimKube, _ := kubeconfigNamespace(t, victimKubeconfig)
	if err := works(t, victimKube, victimNS); err != nil {
		t.Fatalf("the victim's credential stopped working: %v", err)
	}
}

// TestAttackStolenCLITokenExistingNamespaces uses a stolen CLI token on
// its user's bindings.
//
// Attacker: holds a user's stolen CLI token and (a) the cluster ID of the
// user's binding made through the poll flow (issued by the backend, shown
// in the consumer cluster), (b) the clusterIdentity of the user's binding
// made with the CLI; binds with each to get a credential for the
// existing namespace. Stopped by: (a) a cluster identity of the issued
// form is refused (400), and a poll-flow namespace is never reached with
// a token alone (only with the proof of its cluster secret, or by the
// user signing in); (b) is reachable by design for the token's life, and
// the per-user revocation (the revocations ConfigMap) ends it within
// seconds on every replica (401).
func TestAttackStolenCLITokenExistingNamespaces(t *testing.T) {
	victim := binder("stolen-victim")
	revNS := "e2e-revocations-stolen"
	e := startEnv(t, backendOptions{users: []oidcprovider.User{victim},
		extraArgs: append([]string{"--cli-token-revocations=" + revNS + "/revoked"}, unpaced...)})
	e.createNamespace(t, revNS)

	// The victim's poll-flow binding, with a cluster ID the backend issued.
	s := e.createRawSession(t, "")
	client, form := e.loginToSelection(t, s.authURL(t, nil), victim)
	if status, body := e.post(t, client, form, nil); status != http.StatusOK {
		t.Fatalf("poll-flow bind: %d %s", status, body)
	}
	pollKube, pollNS := kubeconfigNamespace(t, s.poll(t).Kubeconfig)
	// The victim's CLI binding.
	victimToken := e.cliLogin(t, victim)
	const uid = "0b9d2c4e-5a61-4f7e-8d3b-2e4c6a8f1b09"
	_, cliNS := boundNamespace(t, e.apiBind(t, victimToken, uid))
	pollTokens := e.tokenSecrets(t, pollNS)

	stolen := victimToken
	// (a) The poll-flow binding's cluster ID: refused before anything.
	r := e.apiBind(t, stolen, s.ClusterID)
	if r.status != http.StatusBadRequest || !strings.Contains(r.apiError(t).Message, "poll flow") {
		t.Fatalf("bind with the poll-flow cluster ID: %d %s, want 400 naming the poll flow", r.status, r.body)
	}
	if n := e.tokenSecrets(t, pollNS); n != pollTokens {
		t.Fatalf("the poll-flow namespace got a new credential (%d token Secrets, %d before)", n, pollTokens)
	}
	if err := works(t, pollKube, pollNS); err != nil {
		t.Fatalf("the poll-flow credential stopped working: %v", err)
	}
	// (b) The CLI binding: reachable with the token, by design...
	if _, ns := boundNamespace(t, e.apiBind(t, stolen, uid)); ns != cliNS {
		t.Fatalf("rebind went to %s, want %s", ns, cliNS)
	}
	// ...until the provider revokes the user's tokens.
	e.revoke(t, revNS, "revoked", victim.Name, time.Now().Add(time.Second))
	awaitStatus(t, "the stolen token refused", func() int { return e.apiBind(t, stolen, uid).status }, http.StatusUnauthorized)
	if msg := e.apiBind(t, stolen, uid).apiError(t); !strings.Contains(msg.Message, "revoked") {
		t.Fatalf("refusal of a revoked token: %+v", msg)
	}
}

// TestAttackRevokedUserToken keeps using a revoked user's token.
//
// Attacker: keeps using the CLI token of a user whose tokens the provider
// revoked (a stolen token, or a user who should no longer bind), on every
// token route, hoping that another replica or the next minute still
// accepts it. Stopped by: the per-user not-before in the revocations
// ConfigMap, watched by every replica: the user's tokens issued before it
// get 401 on every route, another user's token keeps working, and the
// user's token from a login after it works.
func TestAttackRevokedUserToken(t *testing.T) {
	revoked, other := binder("rev-revoked"), binder("rev-other")
	revNS := "e2e-revocations"
	args := append([]string{"--cli-token-revocations=" + revNS + "/revoked"}, unpaced...)
	e := startEnv(t, backendOptions{extraArgs: args, users: []oidcprovider.User{revoked, other}})
	// The ConfigMap does not exist yet: nothing is revoked.
	oldToken, otherToken := e.cliLogin(t, revoked), e.cliLogin(t, other)
	if r := e.apiDo(t, http.MethodGet, "/api/templates", oldToken, nil); r.status != http.StatusOK {
		t.Fatalf("before any revocation: %d %s", r.status, r.body)
	}
	e.createNamespace(t, revNS)
	start := time.Now()
	e.revoke(t, revNS, "revoked", revoked.Name, time.Now().Add(time.Second))
	awaitStatus(t, "the revoked user's token refused", func() int {
		return e.apiDo(t, http.MethodGet, "/api/templates", oldToken, nil).status
	}, http.StatusUnauthorized)
	t.Logf("revocation seen by the backend %s after the ConfigMap was written", time.Since(start).Round(time.Millisecond))
	for _, path := range []string{"/api/templates", "/api/collections"} {
		if r := e.apiDo(t, http.MethodGet, path, oldToken, nil); r.status != http.StatusUnauthorized {
			t.Errorf("%s with the revoked token: %d %s", path, r.status, r.body)
		}
		if r := e.apiDo(t, http.MethodGet, path, otherToken, nil); r.status != http.StatusOK {
			t.Errorf("%s with another user's token: %d %s", path, r.status, r.body)
		}
	}
	if r := e.apiBind(t, oldToken, "9a8b7c6d-0000-4000-8000-000000000001"); r.status != http.StatusUnauthorized {
		t.Errorf("bind with the revoked token: %d %s", r.status, r.body)
	}
	if n := len(e.consumerNamespaces(t, revoked)); n != 0 {
		t.Errorf("the revoked token made %d namespaces", n)
	}
	boundNamespace(t, e.apiBind(t, otherToken, "9a8b7c6d-0000-4000-8000-000000000002"))
	// A login after the not-before gets a token that works.
	time.Sleep(time.Until(start.Add(2 * time.Second)))
	if r := e.apiDo(t, http.MethodGet, "/api/templates", e.cliLogin(t, revoked), nil); r.status != http.StatusOK {
		t.Errorf("a token from a login after the revocation: %d %s", r.status, r.body)
	}
}

// TestAttackTokenRoutesPaced floods the token routes.
//
// Attacker: one user with one CLI token sends requests to the token
// routes as fast as it can, binds above all (each a round of writes to the
// provider cluster). Stopped by: a token bucket per user (subject), in
// memory, for a bounded number of users: beyond the burst the answer is
// 429 with Retry-After in the v1alpha2 error format, for that user only.
func TestAttackTokenRoutesPaced(t *testing.T) {
	flooder, other := binder("pace-flooder"), binder("pace-other")
	e := startEnv(t, backendOptions{users: []oidcprovider.User{flooder, other},
		extraArgs: []string{"--cli-token-request-rate=1", "--cli-token-bind-rate=1"}})
	token, otherToken := e.cliLogin(t, flooder), e.cliLogin(t, other)

	// Requests: a burst of 3, then 429.
	var last apiResult
	n := 0
	for ; n < 10; n++ {
		if last = e.apiDo(t, http.MethodGet, "/api/templates", token, nil); last.status != http.StatusOK {
			break
		}
	}
	if n != 3 || last.status != http.StatusTooManyRequests {
		t.Fatalf("after %d requests: %d %s; want 429 after a burst of 3", n, last.status, last.body)
	}
	if s, err := strconv.Atoi(last.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q", last.header.Get("Retry-After"))
	}
	if msg := last.apiError(t); !strings.Contains(msg.Message, "too many") {
		t.Fatalf("429 says %+v", msg)
	}
	if r := e.apiDo(t, http.MethodGet, "/api/templates", otherToken, nil); r.status != http.StatusOK {
		t.Fatalf("another user is paced by the flooder's bucket: %d %s", r.status, r.body)
	}

	// Binds: a burst of 10 per minute, each request also paced at 1/s.
	time.Sleep(3 * time.Second)
	binds := 0
	for i := range 12 {
		r := e.apiBind(t, token, "7c6d5e4f-1111-4222-8333-444455556666")
		if r.status == http.StatusOK {
			binds++
		}
		if r.status == http.StatusTooManyRequests && strings.Contains(r.apiError(t).Message, "binds") {
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 5 {
				t.Fatalf("bind 429 Retry-After %q, want the wait for a bind token (about a minute)", r.header.Get("Retry-After"))
			}
			if binds != 10 {
				t.Fatalf("the bind bucket ran out after %d binds, want 10", binds)
			}
			t.Logf("bind %d of one user answered 429 with Retry-After %s s", i+1, r.header.Get("Retry-After"))
			return
		}
		time.Sleep(1100 * time.Millisecond) // the request bucket
	}
	t.Fatalf("12 binds in a row were never answered 429 (%d succeeded)", binds)
}

// createNamespace makes a namespace for the test (where the revocations
// ConfigMap lives), if it is not there.
func (e *env) createNamespace(t *testing.T, name string) {
	t.Helper()
	_, err := e.kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

var revokeMu sync.Mutex

// revoke writes the entry of subject into the revocations ConfigMap, as a
// provider would with kubectl.
func (e *env) revoke(t *testing.T, ns, name, subject string, notBefore time.Time) {
	t.Helper()
	revokeMu.Lock()
	defer revokeMu.Unlock()
	ctx := context.Background()
	value := notBefore.UTC().Format(time.RFC3339) + " " + subject
	cms := e.kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{subject: value}}, metav1.CreateOptions{})
	} else if err == nil {
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[subject] = value
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// awaitStatus waits up to 20 s for do to answer want.
func awaitStatus(t *testing.T, what string, do func() int, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	got := 0
	for time.Now().Before(deadline) {
		if got = do(); got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: still %d after 20 s, want %d", what, got, want)
}
