package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// rawSession is a poll session driven by hand, as the wire protocol says,
// so that the test can present any cluster ID with any proof.
type rawSession struct {
	v1alpha1.PollSession
	e *env
}

// createRawSession is POST /sessions presenting clusterID ("" for none).
func (e *env) createRawSession(t *testing.T, clusterID string) *rawSession {
	t.Helper()
	var body []byte
	if clusterID != "" {
		body, _ = json.Marshal(v1alpha1.CreateSessionRequest{ClusterID: clusterID})
	}
	resp, err := http.Post(e.baseURL+"/sessions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /sessions: %d %s", resp.StatusCode, raw)
	}
	s := &rawSession{e: e}
	if err := json.Unmarshal(raw, &s.PollSession); err != nil {
		t.Fatal(err)
	}
	return s
}

// authURL signs the authentication URL, with extra query parameters (the
// cluster proof) covered by the signature.
func (s *rawSession) authURL(t *testing.T, extra url.Values) string {
	t.Helper()
	u, _ := url.Parse(s.e.baseURL + "/authorize")
	u.RawQuery = extra.Encode()
	signed, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return signed.String()
}

// poll polls until the session has a BindingResponse (or fails the test).
func (s *rawSession) poll(t *testing.T) v1alpha1.BindingResponse {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	u, _ := url.Parse(s.e.baseURL + "/poll")
	for time.Now().Before(deadline) {
		signed, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(signed.String())
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			var br v1alpha1.BindingResponse
			if err := json.Unmarshal(raw, &br); err != nil {
				t.Fatal(err)
			}
			return br
		case http.StatusForbidden, http.StatusTooManyRequests:
			if !strings.Contains(string(raw), v1alpha1.ErrorAuthorizationPending) && !strings.Contains(string(raw), v1alpha1.ErrorSlowDown) {
				t.Fatalf("poll: %d %s", resp.StatusCode, raw)
			}
		default:
			t.Fatalf("poll: %d %s", resp.StatusCode, raw)
		}
		time.Sleep(1100 * time.Millisecond)
	}
	t.Fatal("no BindingResponse within 2 minutes")
	return v1alpha1.BindingResponse{}
}

// bindInBrowser opens link in a fresh browser, signs alice in, checks the
// page's confirmation code and what it says the bind does, confirms and
// binds mangodbs. It returns the text of the check box on the page.
func bindInBrowser(t *testing.T, e *env, link, wantCode, wantKind string) string {
	t.Helper()
	b := chromium.New(t)
	if status := b.Open(link); status != http.StatusOK {
		t.Fatalf("link led to %d at %s: %s", status, b.URL(), b.Text("body"))
	}
	chromium.SignIn(t, b, alice)
	if !strings.HasPrefix(b.URL(), e.baseURL+"/bind") {
		t.Fatalf("after login the browser is at %s:\n%s", b.URL(), b.Text("body"))
	}
	// The code on the page is the one the client computes and prints.
	if code := b.Text("#confirmation-code"); code != wantCode {
		t.Errorf("page shows confirmation code %q, the client prints %q", code, wantCode)
	}
	check := b.Text(".check")
	if !strings.Contains(check, "Continue only if this code matches the one in your own terminal") {
		t.Errorf("the page does not say to compare the code:\n%s", check)
	}
	if kind := b.Text("#binding-kind"); !strings.Contains(kind, wantKind) {
		t.Errorf("the page says %q, want %q", kind, wantKind)
	}
	b.Click("input[value='mangodbs.mangodb.com']")
	b.Click("#confirm")
	if status := b.ClickAndWait("button[value=bind]"); status != http.StatusOK {
		t.Fatalf("bind answered %d: %s", status, b.Text("body"))
	}
	return check
}

func kubeconfigNamespace(t *testing.T, kubeconfig []byte) (kubernetes.Interface, string) {
	t.Helper()
	rc, ns := testutil.IssuedConfig(t, kubeconfig)
	return kubernetes.NewForConfigOrDie(rc), ns
}

// works says whether a consumer credential can still read its namespace.
func works(t *testing.T, kube kubernetes.Interface, ns string) error {
	t.Helper()
	_, err := kube.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	return err
}

// TestPhishedLinkGetsNoExistingNamespace is the phishing attack on a
// victim's namespace: the attacker creates a session presenting the
// victim's cluster ID, with no proof, a forged proof, or the victim's
// proof of an earlier session, and gets the victim to bind through that
// link. The attacker's poll never yields a credential for the victim's
// namespace, and the victim's credential keeps working. The victim's own rebind, with the proof,
// lands in the same namespace with a new token.
func TestPhishedLinkGetsNoExistingNamespace(t *testing.T) {
	e := startEnv(t, backendOptions{})

	// The victim binds: a new cluster ID, with its cluster secret.
	first := e.createRawSession(t, "")
	if first.ClusterSecret == "" || len(first.ClusterSecret) < 43 {
		t.Fatalf("a new cluster ID came with cluster secret %q, want >= 256 bits", first.ClusterSecret)
	}
	bindInBrowser(t, e, first.authURL(t, nil), protocol.ConfirmationCode(first.SessionID), "creates a new binding")
	firstResp := first.poll(t)
	victimKube, victimNS := kubeconfigNamespace(t, firstResp.Kubeconfig)
	ns, err := e.kube.CoreV1().Namespaces().Get(context.Background(), victimNS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Annotations[binding.AnnotationCluster] != first.ClusterID {
		t.Fatalf("victim namespace %s has cluster %q, want %q", victimNS, ns.Annotations[binding.AnnotationCluster], first.ClusterID)
	}

	// The victim binds again, proving the cluster ID: same namespace, a new
	// token, and the page says it updates the binding made earlier.
	again := e.createRawSession(t, first.ClusterID)
	if again.ClusterID != first.ClusterID || again.ClusterSecret != "" {
		t.Fatalf("presented cluster ID: answer has %q and secret %q, want it echoed without a secret", again.ClusterID, again.ClusterSecret)
	}
	proof := protocol.ClusterProof(first.ClusterSecret, again.SessionID)
	bindInBrowser(t, e, again.authURL(t, url.Values{protocol.ProofParam: {proof}}), protocol.ConfirmationCode(again.SessionID),
		"updates your existing binding, made on")
	againResp := again.poll(t)
	kube2, ns2 := kubeconfigNamespace(t, againResp.Kubeconfig)
	if ns2 != victimNS {
		t.Fatalf("a proven rebind went to namespace %s, want %s", ns2, victimNS)
	}
	if bytes.Equal(againResp.Kubeconfig, firstResp.Kubeconfig) {
		t.Error("the rebind handed out the credential already in use")
	}
	if err := works(t, kube2, victimNS); err != nil {
		t.Fatalf("the new credential: %v", err)
	}
	victimKube = kube2
	before := len(e.consumerNamespaces(t, alice))

	for _, attack := range []struct {
		name  string
		proof func(sid string) url.Values
	}{
		{"no proof", func(string) url.Values { return nil }},
		{"forged proof", func(sid string) url.Values {
			return url.Values{protocol.ProofParam: {protocol.ClusterProof("guessed-cluster-secret", sid)}}
		}},
		{"proof replayed from the victim's earlier session", func(string) url.Values {
			return url.Values{protocol.ProofParam: {proof}}
		}},
	} {
		t.Run(attack.name, func(t *testing.T) {
			attacker := e.createRawSession(t, first.ClusterID)
			link := attacker.authURL(t, attack.proof(attacker.SessionID))
			// The victim opens the attacker's link and binds anyway. The page
			// shows the attacker's session code (not the victim's) and says
			// this creates a new binding, not an update of the victim's.
			check := bindInBrowser(t, e, link, protocol.ConfirmationCode(attacker.SessionID), "creates a new binding")
			if !strings.Contains(check, "could not prove") {
				t.Errorf("the page does not say the presented cluster was not proven:\n%s", check)
			}
			stolen := attacker.poll(t)
			attackerKube, attackerNS := kubeconfigNamespace(t, stolen.Kubeconfig)
			if attackerNS == victimNS {
				t.Fatalf("the attacker got a credential for the victim's namespace %s", victimNS)
			}
			if err := works(t, attackerKube, victimNS); !apierrors.IsForbidden(err) {
				t.Errorf("the attacker's credential on the victim's namespace: %v, want Forbidden", err)
			}
			got, err := e.kube.CoreV1().Namespaces().Get(context.Background(), attackerNS, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if cid := got.Annotations[binding.AnnotationCluster]; cid == first.ClusterID {
				t.Errorf("the attacker's namespace carries the victim's cluster ID")
			}
			if err := works(t, victimKube, victimNS); err != nil {
				t.Errorf("the victim's credential stopped working: %v", err)
			}
		})
	}
	if got := e.consumerNamespaces(t, alice); len(got) != before+3 {
		t.Errorf("alice has %d namespaces %v, want %d: one new per attack", len(got), got, before+3)
	}
}
