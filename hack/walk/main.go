// Command walk measures the two walks of docs/architecture.md: the
// production files of the module (and their packages) that a bind in the
// browser, and a poll at a replica that does not own the session, run
// through. It runs two replicas of the backend in this process, on the
// ring over a real provider cluster with the real identity provider,
// and takes the module's statement coverage around each request: it
// clears the counters, makes the request, and lists the files with a
// statement run. What runs in the background meanwhile (a timer, an
// informer) is in one window but hardly in every one, so a walk is what
// every one of -runs windows ran.
//
// It must be built with coverage of the module; hack/walk.sh does that
// and runs it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime/coverage"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/server"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/ring"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

const module = "github.com/kbprovider/backend/"

// notOnTheWay are the module's folders whose statements run in a window
// without being on a request's way: the test helpers and the local
// environment, and the provider-side controllers with their informers'
// cache trimming, which react in goroutines of their own to the objects a
// bind makes.
var notOnTheWay = []string{"internal/testutil", "internal/localenv/", "hack/", "internal/binding/controllers/", "internal/binding/kbcache/"}

func main() {
	runs := flag.Int("runs", 5, "windows per walk; a walk is the files every window ran")
	flag.Parse()
	if err := run(*runs); err != nil {
		fmt.Fprintln(os.Stderr, "walk:", err)
		os.Exit(1)
	}
}

func run(runs int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := start(ctx)
	defer e.stop()
	if err != nil {
		return err
	}

	var bind, poll map[string]bool
	for range runs {
		s, err := e.newSession()
		if err != nil {
			return err
		}
		b, err := e.bind(s)
		if err != nil {
			return err
		}
		p, err := e.pollAtNonOwner(s)
		if err != nil {
			return err
		}
		bind, poll = intersect(bind, b), intersect(poll, p)
	}
	report("a bind (GET /authorize, GET /callback, GET /bind, POST /bind; the identity provider's part not counted)", bind)
	report("a poll at a replica that does not own the session (its first 200)", poll)
	return nil
}

// env is a provider cluster, the identity provider and two replicas.
type env struct {
	cp       *controlplane.ControlPlane
	idp      *oidcprovider.Provider
	replicas []string // public base URLs
	peers    []string // peer URLs, in the same order
	owner    *ring.Store
	stops    []func()
}

func (e *env) stop() {
	for _, s := range slices.Backward(e.stops) {
		s()
	}
}

func start(ctx context.Context) (*env, error) {
	e := &env{}
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return e, err
	}
	e.cp = cp
	e.stops = append(e.stops, func() { cp.Stop() })
	if err := exampleapis.Prepare(ctx, cp, exampleapis.MangoDB); err != nil {
		return e, err
	}
	if err := exampleapis.AwaitQuotaCounting(ctx, cp); err != nil {
		return e, err
	}
	admin := cp.AdminConfig()
	if _, err := kubernetes.NewForConfigOrDie(admin).CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-bind"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return e, err
	}
	dir, err := os.MkdirTemp("", "walk-")
	if err != nil {
		return e, err
	}
	e.stops = append(e.stops, func() { os.RemoveAll(dir) })
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, admin); err != nil {
		return e, err
	}

	var listen, peerListen []string
	for range 2 {
		a, err := freeAddr()
		if err != nil {
			return e, err
		}
		p, err := freeAddr()
		if err != nil {
			return e, err
		}
		listen, peerListen = append(listen, a), append(peerListen, p)
		e.replicas = append(e.replicas, "http://"+a)
		e.peers = append(e.peers, "https://"+p)
	}
	var redirects []string
	for _, r := range e.replicas {
		redirects = append(redirects, r+"/callback")
	}
	e.idp, err = oidcprovider.RunRetrying(ctx, oidcprovider.Options{RedirectURIs: redirects, Users: []oidcprovider.User{oidcprovider.Alice}}, nil)
	if err != nil {
		return e, err
	}
	e.stops = append(e.stops, e.idp.Stop)

	peerKey := bytes.Repeat([]byte("p"), 32)
	for i := range 2 {
		ext, _ := url.Parse(e.replicas[i])
		cfg := server.Config{
			ListenAddress: listen[i], DiagnosticsAddress: "127.0.0.1:0", ExternalURL: ext,
			Logger:     slog.New(slog.DiscardHandler),
			PrettyName: "Walk", SessionTTL: 10 * time.Minute, PollInterval: time.Second, GracePeriod: time.Minute,
			MaxPolledSessions: 100, ShutdownTimeout: 5 * time.Second,
			Store: server.StoreConfig{Kind: server.StoreRing, Namespace: "kube-bind", PeerListenAddress: peerListen[i],
				WriteRate: sessions.DefaultLimits.WriteRate, MaxRecords: sessions.DefaultLimits.MaxRecords,
				PeerSelfURL: e.peers[i], Peers: e.peers, PeerKeys: [][]byte{peerKey}},
			OIDC:       oidc.Options{IssuerURL: e.idp.IssuerURL, ClientID: e.idp.ClientID, ClientSecret: e.idp.ClientSecret},
			ClusterKey: clusterkey.Options{Keys: [][]byte{bytes.Repeat([]byte("k"), 32)}},
		}
		cfg.Browser.SigningKeys = [][]byte{bytes.Repeat([]byte("s"), 32)}
		cfg.Browser.EncryptionKeys = [][]byte{bytes.Repeat([]byte("e"), 32)}
		cfg.Provider.Kubeconfig = kubeconfig
		cfg.Provider.NamespacePrefix = "walk-"
		cfg.Provider.ConsumerScope = binding.ScopeNamespaced
		cfg.Controllers.Credentials = credentials.Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute}
		s, err := server.New(ctx, cfg)
		if err != nil {
			return e, err
		}
		sctx, scancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Run(sctx) }()
		e.stops = append(e.stops, func() { scancel(); <-done })
		if err := awaitReady("http://" + s.DiagnosticsAddr().String() + "/readyz"); err != nil {
			return e, err
		}
	}
	// The ring's own placement, to know each session's owner.
	e.owner, err = ring.New(ring.Options{Self: e.peers[0], Keys: [][]byte{peerKey}, Inner: memory.New(sessions.Limits{}, nil)})
	if err != nil {
		return e, err
	}
	e.owner.SetPeers(e.peers)
	return e, nil
}

// session is a poll session opened at the first replica.
type session struct {
	v1alpha1.PollSession
}

func (e *env) newSession() (*session, error) {
	resp, err := http.Post(e.replicas[0]+"/sessions", "application/json", strings.NewReader("{}"))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	s := &session{}
	if err := json.Unmarshal(b, &s.PollSession); err != nil || s.SessionID == "" {
		return nil, fmt.Errorf("POST /sessions: %d %s", resp.StatusCode, b)
	}
	return s, nil
}

func signed(base, path string, s *session) string {
	u, _ := url.Parse(base + path)
	su, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		panic(err)
	}
	return su.String()
}

// bind does the browser's part at the first replica and returns the
// files its four requests to the backend ran.
func (e *env) bind(s *session) (map[string]bool, error) {
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	files := map[string]bool{}
	step := func(req *http.Request, want int) (*http.Response, []byte, error) {
		var resp *http.Response
		var body []byte
		var err error
		got, cerr := covered(func() {
			resp, err = browser.Do(req)
			if err == nil {
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		})
		if cerr != nil {
			return nil, nil, cerr
		}
		if err != nil {
			return nil, nil, err
		}
		if resp.StatusCode != want {
			return nil, nil, fmt.Errorf("%s %s: %d, want %d: %.300s", req.Method, req.URL, resp.StatusCode, want, body)
		}
		for f := range got {
			files[f] = true
		}
		return resp, body, nil
	}
	get := func(u string) *http.Request { r, _ := http.NewRequest(http.MethodGet, u, nil); return r }

	resp, _, err := step(get(signed(e.replicas[0], "/authorize", s)), http.StatusSeeOther)
	if err != nil {
		return nil, err
	}
	callback, err := e.idp.Login(context.Background(), browser, resp.Header.Get("Location"), oidcprovider.Alice.Name, oidcprovider.Alice.Password)
	if err != nil {
		return nil, err
	}
	resp, _, err = step(get(callback.String()), http.StatusSeeOther)
	if err != nil {
		return nil, err
	}
	page, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if err != nil {
		return nil, err
	}
	resp, body, err := step(get(page.String()), http.StatusOK)
	if err != nil {
		return nil, err
	}
	forms, err := testutil.ParseForms(body)
	if err != nil || len(forms) == 0 {
		return nil, fmt.Errorf("no form on the selection page (%w): %.300s", err, body)
	}
	form := forms[0].Fields
	form.Add(web.FieldAPI, exampleapis.MangoDB.Name())
	form.Set(web.FieldAction, web.ActionBind)
	form.Set(web.FieldConfirm, web.ConfirmYes)
	action, err := resp.Request.URL.Parse(forms[0].Action)
	if err != nil {
		return nil, err
	}
	post, _ := http.NewRequest(http.MethodPost, action.String(), strings.NewReader(form.Encode()))
	post.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	post.Header.Set("Origin", e.replicas[0])
	post.Header.Set("Sec-Fetch-Site", "same-origin")
	if _, _, err := step(post, http.StatusOK); err != nil {
		return nil, err
	}
	return files, nil
}

// pollAtNonOwner polls the bound session s at the replica that does not
// own it, and returns the files that poll ran.
func (e *env) pollAtNonOwner(s *session) (map[string]bool, error) {
	at := e.replicas[1]
	if _, remote := e.owner.PickPeer(s.SessionID); remote {
		at = e.replicas[0]
	}
	req, _ := http.NewRequest(http.MethodGet, signed(at, "/poll", s), nil)
	var status int
	var body []byte
	files, err := covered(func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			body = []byte(err.Error())
			return
		}
		status = resp.StatusCode
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	})
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("poll at %s: %d %.300s", at, status, body)
	}
	return files, nil
}

// covered runs do between clearing the coverage counters and writing
// them, and returns the production files of the module that ran a
// statement meanwhile (test helpers and the local environment left out).
func covered(do func()) (map[string]bool, error) {
	dir, err := os.MkdirTemp("", "walk-cover-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := coverage.WriteMetaDir(dir); err != nil {
		return nil, err
	}
	if err := coverage.ClearCounters(); err != nil {
		return nil, err
	}
	do()
	if err := coverage.WriteCountersDir(dir); err != nil {
		return nil, err
	}
	profile := filepath.Join(dir, "profile.txt")
	if out, err := exec.Command("go", "tool", "covdata", "textfmt", "-i="+dir, "-o="+profile).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go tool covdata: %w: %s", err, out)
	}
	f, err := os.Open(profile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// file.go:line.col,line.col statements count
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			continue
		}
		if n, err := strconv.Atoi(fields[2]); err != nil || n == 0 {
			continue
		}
		name, _, _ := strings.Cut(fields[0], ":")
		rel, ok := strings.CutPrefix(name, module)
		if !ok || slices.ContainsFunc(notOnTheWay, func(prefix string) bool { return strings.HasPrefix(rel, prefix) }) {
			continue
		}
		files[rel] = true
	}
	return files, sc.Err()
}

func intersect(acc, next map[string]bool) map[string]bool {
	if acc == nil {
		return next
	}
	for f := range acc {
		if !next[f] {
			delete(acc, f)
		}
	}
	return acc
}

func report(what string, files map[string]bool) {
	var list []string
	pkgs := map[string]bool{}
	for f := range files {
		list = append(list, f)
		pkgs[path.Dir(f)] = true
	}
	slices.Sort(list)
	fmt.Printf("%s: %d files in %d packages\n", what, len(list), len(pkgs))
	for _, f := range list {
		fmt.Println("  " + f)
	}
}

func freeAddr() (string, error) {
	port, err := procs.UnusedPort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

func awaitReady(u string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(u); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("not ready within a minute: " + u)
}
