package replicas

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/kbprovider/backend/internal/hmac"
	"github.com/kbprovider/backend/internal/sessions/hashring"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/bindproof"
	"github.com/kbprovider/backend/web"
)

const pollInterval = time.Second

// replica is one backend process.
type replica struct {
	name    string
	addr    string // public listener, host:port
	peerURL string // peer API base URL
	args    []string
	cmd     *exec.Cmd
	logs    *procs.Buffer
	exited  chan struct{}
	waitErr error // valid once exited is closed
}

// start runs the replica until the test ends (or kill).
func (r *replica) start(t *testing.T) {
	t.Helper()
	r.cmd = exec.Command(backendproc.Binary, r.args...)
	r.logs = &procs.Buffer{}
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", r.name, err)
	}
	r.exited = make(chan struct{})
	go func() { r.waitErr = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-r.exited
		}
		if t.Failed() {
			t.Logf("logs of %s:\n%s", r.name, r.logs.String())
		}
	})
}

// kill ends the replica the hard way, as a crashed pod or node would.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	r.cmd.Process.Kill()
	<-r.exited
}

// stop sends SIGTERM and expects a clean exit: both the public server and
// the peer API shut down gracefully.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.awaitStopped(t, 10*time.Second)
}

// readyz returns /readyz's status and body.
func (r *replica) readyz() (int, string, error) {
	resp, err := http.Get("http://" + r.addr + "/readyz?verbose")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// waitReady waits until /readyz answers 200.
func (r *replica) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body, err := r.readyz()
		if code == http.StatusOK {
			return
		}
		select {
		case <-r.exited:
			t.Fatalf("%s exited:\n%s", r.name, r.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 60s: %d %s %v\nlogs:\n%s", r.name, code, body, err, r.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// front stands for the Service in front of the replicas: the external URL
// of every replica. Tests pick the replica it sends to.
type front struct {
	srv    *httptest.Server
	url    string
	target atomic.Pointer[replica]
	hits   map[string]*atomic.Int64
}

func newFront(t *testing.T, replicas ...*replica) *front {
	f := &front{hits: map[string]*atomic.Int64{}}
	for _, r := range replicas {
		f.hits[r.name] = &atomic.Int64{}
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		r := f.target.Load()
		pr.SetURL(&url.URL{Scheme: "http", Host: r.addr})
		pr.Out.Host = pr.In.Host
		f.hits[r.name].Add(1)
	}}
	f.srv = httptest.NewServer(rp)
	t.Cleanup(f.srv.Close)
	f.url = f.srv.URL
	return f
}

func (f *front) pin(r *replica) { f.target.Store(r) }

// writeFile writes a file the backend reads (keys), mode 0600.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newReplica prepares (does not start) a replica on fresh loopback ports.
func newReplica(t *testing.T, name string) *replica {
	port, peerPort := procs.FreePort(t), procs.FreePort(t)
	return &replica{
		name:    name,
		addr:    fmt.Sprintf("127.0.0.1:%d", port),
		peerURL: fmt.Sprintf("http://127.0.0.1:%d", peerPort),
	}
}

// hashringArgs are the flags of a replica in a hashring with peerKeyFile.
func (r *replica) hashringArgs(peerKeyFile string) []string {
	u, _ := url.Parse(r.peerURL)
	return []string{
		"--listen-address", r.addr,
		"--session-store", "hashring",
		"--peer-listen-address", u.Host,
		"--peer-key-file", peerKeyFile,
		"--poll-interval", pollInterval.String(),
		"--log-format", "text",
		"--log-level", "debug",
	}
}

// awaitStopped waits up to limit for the replica, told to stop, to exit
// cleanly with its peer API closed.
func (r *replica) awaitStopped(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-r.exited:
	case <-time.After(limit):
		t.Fatalf("%s still running %s after SIGTERM", r.name, limit)
	}
	if r.waitErr != nil || !strings.Contains(r.logs.String(), "msg=stopped") {
		t.Errorf("%s after SIGTERM: %v\n%s", r.name, r.waitErr, r.logs.String())
	}
	u, _ := url.Parse(r.peerURL)
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		t.Errorf("%s: the peer API still accepts connections after shutdown", r.name)
	}
}

// bindForm is the selection page's form (its hidden fields) with the
// exported CRD chosen and Bind confirmed.
func bindForm(page url.Values) url.Values {
	form := url.Values{}
	for k, v := range page {
		form[k] = v
	}
	form.Add(web.FieldAPI, exportedCRD)
	form.Set(web.FieldAction, web.ActionBind)
	form.Set(web.FieldConfirm, web.ConfirmYes)
	return form
}

// ringKeys are the secrets every replica of a test's ring shares.
type ringKeys struct{ peerKeyFile, sign, enc, cluster string }

func newRingKeys(t *testing.T) ringKeys {
	return ringKeys{
		peerKeyFile: writeFile(t, "peer-key", procs.RandomKey(t, 32)+"\n"),
		sign:        procs.RandomKey(t, 64), enc: procs.RandomKey(t, 32), cluster: procs.RandomKey(t, 32),
	}
}

// peerURLs are the peer URLs of reps.
func peerURLs(reps []*replica) []string {
	var peers []string
	for _, r := range reps {
		peers = append(peers, r.peerURL)
	}
	return peers
}

// ringArgs are the flags of a replica in a static ring of reps behind the
// external URL ext, logging in through idp, provisioning on cp.
func (r *replica) ringArgs(keys ringKeys, reps []*replica, ext string, idp *oidcprovider.Provider, cp *controlplane.ControlPlane) []string {
	return append(r.hashringArgs(keys.peerKeyFile),
		"--peers", strings.Join(peerURLs(reps), ","),
		"--external-url", ext,
		"--oidc-issuer-url", idp.IssuerURL,
		"--oidc-issuer-client-id", idp.ClientID,
		"--oidc-issuer-client-secret", idp.ClientSecret,
		"--oidc-allowed-groups", "binders",
		"--cookie-signing-key", keys.sign,
		"--cookie-encryption-key", keys.enc,
		"--cluster-secret-key", keys.cluster,
		"--kubeconfig", cp.AdminKubeconfigPath(),
		"--namespace-prefix", namespacePrefix,
	)
}

// ownerRing computes which peer owns a session ID, with the hashring's own
// consistent hash.
type ownerRing struct{ s *hashring.Store }

func newOwnerRing(t *testing.T, self string) *ownerRing {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	s, err := hashring.New(hashring.Options{Self: self, Key: key, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &ownerRing{s: s}
}

func (o *ownerRing) owner(peers []string, id string) string {
	return hashring.OwnerOf(peers, id)
}

// session is a poll session as the client holds it.
type session struct {
	v1alpha1.PollSession
	ext string // external URL the signatures are made for
	// clusterSecret, when set, proves the presented cluster ID in the
	// authentication URL (pkg/bindproof).
	clusterSecret string
}

// createSession posts a session to replica r; it returns the status and,
// for 201, the session.
func createSession(t *testing.T, r *replica, ext, clusterID string) (int, *session) {
	t.Helper()
	body := "{}"
	if clusterID != "" {
		body = fmt.Sprintf(`{"clusterID":%q}`, clusterID)
	}
	resp, err := http.Post("http://"+r.addr+"/sessions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST /sessions on %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, nil
	}
	s := &session{ext: ext}
	if err := json.Unmarshal(b, &s.PollSession); err != nil || s.SessionID == "" || s.SessionSecret == "" {
		t.Fatalf("POST /sessions on %s: %s (%v)", r.name, b, err)
	}
	return resp.StatusCode, s
}

// mustCreate creates a session on r, retrying 503 (the ID's owner is dead
// or full) the way a client honours Retry-After, without the wait.
func mustCreate(t *testing.T, r *replica, ext, clusterID string) *session {
	t.Helper()
	for i := 0; i < 30; i++ {
		code, s := createSession(t, r, ext, clusterID)
		switch code {
		case http.StatusCreated:
			return s
		case http.StatusServiceUnavailable:
			continue
		default:
			t.Fatalf("POST /sessions on %s: %d", r.name, code)
		}
	}
	t.Fatalf("POST /sessions on %s: 503 thirty times", r.name)
	return nil
}

// signedPoll is the URL of one signed poll (one fresh nonce) for the
// advertised poll URL.
func (s *session) signedPoll(t *testing.T) *url.URL {
	t.Helper()
	u, err := url.Parse(s.ext + "/poll")
	if err != nil {
		t.Fatal(err)
	}
	signed, err := hmac.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

// authURL is the signed authentication URL the client shows the user.
func (s *session) authURL(t *testing.T) string {
	t.Helper()
	u, _ := url.Parse(s.ext + "/authorize")
	if s.clusterSecret != "" {
		u.RawQuery = url.Values{bindproof.ProofParam: {bindproof.ClusterProof(s.clusterSecret, s.SessionID)}}.Encode()
	}
	signed, err := hmac.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return signed.String()
}

// pollAnswer is what a replica answered to a poll.
type pollAnswer struct {
	status     int
	code, msg  string
	retryAfter string
	body       []byte
	took       time.Duration
}

func (a pollAnswer) String() string {
	return fmt.Sprintf("%d %s %q Retry-After %q (%s)", a.status, a.code, a.msg, a.retryAfter, a.took)
}

// send sends a signed poll to replica r directly (the signature is for the
// external URL, which every replica checks against).
func send(t *testing.T, r *replica, signed *url.URL) pollAnswer {
	t.Helper()
	u := *signed
	u.Scheme, u.Host = "http", r.addr
	client := &http.Client{Timeout: 15 * time.Second}
	start := time.Now()
	resp, err := client.Get(u.String())
	if err != nil {
		t.Fatalf("poll on %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := pollAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b, took: time.Since(start)}
	var e v1alpha1.Error
	if json.Unmarshal(b, &e) == nil {
		a.code, a.msg = e.Error, e.Message
	}
	return a
}

// bindInBrowser does the browser part of a session like a browser with
// cookies would, through the front: the authentication URL, the login at
// the identity provider, the callback, the selection page and the bind
// POST. It returns the status of the page after the bind.
func bindInBrowser(t *testing.T, ctx context.Context, idp *oidcprovider.Provider, f *front, s *session, user oidcprovider.User) int {
	t.Helper()
	status, done := openSelection(t, ctx, idp, f, s, user).bind(t, ctx)
	if status == http.StatusOK && !strings.Contains(strings.ToLower(done), "terminal") {
		t.Errorf("done page does not send the user back to the terminal:\n%s", done)
	}
	return status
}

// selection is a browser on the API selection page.
type selection struct {
	client *http.Client
	f      *front
	target *url.URL
	form   url.Values
}

// openSelection logs user in for session s and returns the selection page.
func openSelection(t *testing.T, ctx context.Context, idp *oidcprovider.Provider, f *front, s *session, user oidcprovider.User) *selection {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	callback, err := idp.Login(ctx, client, s.authURL(t), user.Name, user.Password)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	if !strings.HasPrefix(callback.String(), f.url+"/callback") {
		t.Fatalf("login ended at %s, want the backend's callback", callback)
	}
	resp, err := client.Get(callback.String())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("callback led to %d at %s:\n%s", resp.StatusCode, resp.Request.URL, page)
	}
	action, form := selectionForm(t, page)
	if form.Get(web.FieldCSRF) == "" {
		t.Fatalf("no selection form at %s:\n%s", resp.Request.URL, page)
	}
	return &selection{client: client, f: f, target: resp.Request.URL.ResolveReference(&url.URL{Path: action}), form: form}
}

// bind picks the exported API and presses Bind; it returns the status and
// the page.
func (sel *selection) bind(t *testing.T, ctx context.Context) (int, string) {
	t.Helper()
	form := bindForm(sel.form)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sel.target.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", sel.f.url)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := sel.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(page)
}

// selectionForm returns the action and the hidden fields of the page's
// form.
func selectionForm(t *testing.T, page []byte) (string, url.Values) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(string(page)))
	if err != nil {
		t.Fatal(err)
	}
	var action string
	fields := url.Values{}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			attr := map[string]string{}
			for _, a := range n.Attr {
				attr[a.Key] = a.Val
			}
			switch {
			case n.Data == "form" && action == "":
				action = attr["action"]
			case n.Data == "input" && attr["type"] == "hidden":
				fields.Add(attr["name"], attr["value"])
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return action, fields
}
