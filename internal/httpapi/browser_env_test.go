package httpapi

import (
	"context"
	"errors"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// The browser tests of this package run the real router with the real
// browser handler, the real memory store and the real oidc.Authenticator
// against a real identity provider (test/oidcprovider, Node.js). One
// provider and one loopback server serve the whole package: the provider
// knows exactly one redirect URL, so every browserEnv is put behind the
// same server in turn (the tests of this package do not run in parallel).

func TestMain(m *testing.M) {
	code := m.Run()
	stopShared()
	os.Exit(code)
}

var shared struct {
	once    sync.Once
	err     error
	idp     *oidcprovider.Provider
	srv     *httptest.Server
	handler atomic.Pointer[http.Handler]
}

var idpUser = oidcprovider.User{Name: "ada", Password: "ada-pw", Email: "ada@example.com", Groups: []string{"binders"}}

func sharedServer(t *testing.T) (*httptest.Server, *oidcprovider.Provider) {
	t.Helper()
	shared.once.Do(func() {
		shared.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			(*shared.handler.Load()).ServeHTTP(w, r)
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		shared.idp, shared.err = oidcprovider.RunRetrying(ctx, oidcprovider.Options{
			RedirectURIs: []string{shared.srv.URL + "/callback"},
			Users:        []oidcprovider.User{idpUser},
		}, nil)
	})
	if shared.err != nil {
		t.Fatalf("starting the identity provider: %v", shared.err)
	}
	return shared.srv, shared.idp
}

// stopShared ends the package's identity provider and server.
func stopShared() {
	if shared.idp != nil {
		shared.idp.Stop()
	}
	if shared.srv != nil {
		shared.srv.Close()
	}
}

// browserEnv is env with the browser part wired in.
type browserEnv struct {
	*env
	idp   *oidcprovider.Provider
	login *oidc.Authenticator
	// tokenDiversion, when set, is the address the identity provider's token
	// endpoint is reached at instead of the real one (a server that
	// accepts and never answers, to play a hanging identity provider).
	tokenDiversion atomic.Pointer[string]
	// idpRequests counts requests to the identity provider by path.
	idpMu       sync.Mutex
	idpRequests map[string]int
}

type browserOpts struct {
	limits sessions.Limits
	// oidc adjusts the Authenticator's configuration.
	oidc func(*oidc.Config)
	// https makes the external URL https (same host and port), as behind
	// a TLS-terminating ingress; the test server stays plain http (see
	// tlsJar).
	https bool
	// sessionCreateRate is Config.SessionCreateRate (0: no limit).
	sessionCreateRate float64
}

func newBrowserEnv(t *testing.T, o browserOpts) *browserEnv {
	t.Helper()
	srv, idp := sharedServer(t)
	ext, _ := url.Parse(srv.URL)
	if o.https {
		ext.Scheme = "https"
	}
	clock := testutil.ClockAt(time.Now())
	store := memory.New(o.limits, clock.Now)
	key, err := clusterkey.New(testClusterKey)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sessionkey.New(testSessionKey)
	if err != nil {
		t.Fatal(err)
	}
	svc := newService(t, store, keys, key, 0, o.limits.Grace, clock.Now)
	logs := &procs.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	be := &browserEnv{idp: idp, idpRequests: map[string]int{}}

	transport := http.DefaultTransport.(*http.Transport).Clone()
	idpURL, _ := url.Parse(idp.IssuerURL)
	ocfg := oidc.Config{
		IssuerURL:    idp.IssuerURL,
		ClientID:     idp.ClientID,
		ClientSecret: idp.ClientSecret,
		RedirectURL:  srv.URL + "/callback",
		SigningKey:   []byte("0123456789abcdef0123456789abcdef-browser-test"),
		// As internal/server sets it.
		SecureCookies: ext.Scheme == "https",
		UseOnce:       lifecycle.LoginStates(store, 0, clock.Now),
		HTTPClient: &http.Client{Timeout: 30 * time.Second, Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.URL.Host == idpURL.Host {
				be.idpMu.Lock()
				be.idpRequests[r.URL.Path]++
				be.idpMu.Unlock()
				if to := be.tokenDiversion.Load(); to != nil && strings.HasSuffix(r.URL.Path, "/token") {
					r = r.Clone(r.Context())
					r.URL.Host = *to
				}
			}
			return transport.RoundTrip(r)
		})},
		Logger: logger.With("component", "oidc"),
	}
	if o.oidc != nil {
		o.oidc(&ocfg)
	}
	login, err := oidc.New(ocfg)
	if err != nil {
		t.Fatal(err)
	}
	be.login = login
	bh := testBrowser(t, ext, svc, login, logger, clock.Now)
	reg := prometheus.NewRegistry()
	h, err := New(Config{
		ExternalURL:  ext,
		PollInterval: time.Second,
		Sessions:     svc,
		Logger:       logger,
		Metrics:      reg,
		Readiness:    nil,
		Parts:        testParts(t, ext, svc, reg, partsOpts{browser: bh, interval: time.Second}),
		Now:          clock.Now,

		SessionCreateRate: o.sessionCreateRate,
	})
	if err != nil {
		t.Fatal(err)
	}
	shared.handler.Store(&h)
	be.env = &env{t: t, ext: ext, store: store, svc: svc, keys: keys, clock: clock, reg: reg, handler: h, srv: srv, logs: logs, key: key}
	return be
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// testCatalog exports mangodbs.mangodb.com only.
var testCatalog = fakes.Catalog{fakes.MangoDBs}

// refusingProvisioner stands for the provider cluster in tests that must
// never get as far as provisioning.
var refusingProvisioner = &fakes.Provisioner{Err: errors.New("test: nothing may be provisioned here")}

// jar returns a client with a cookie jar that does not follow redirects,
// like a browser whose every hop the test looks at.
func (be *browserEnv) jar() *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		be.t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// tlsJar is jar for an https external URL: the client sees https (its
// jar keeps and sends Secure cookies), and its requests to the external
// host reach the plain-http test server, as through a TLS-terminating
// ingress.
func (be *browserEnv) tlsJar() *http.Client {
	c := be.jar()
	transport := http.DefaultTransport.(*http.Transport).Clone()
	be.t.Cleanup(transport.CloseIdleConnections)
	c.Transport = roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.URL.Scheme == "https" && r.URL.Host == be.ext.Host {
			r = r.Clone(r.Context())
			r.URL.Scheme = "http"
		}
		return transport.RoundTrip(r)
	})
	return c
}

// send sends method to u with client and returns the answer and its body.
func (be *browserEnv) send(client *http.Client, method, u string) (*http.Response, string) {
	be.t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		be.t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		be.t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, string(readAll(be.t, resp))
}

// authURL creates a poll session and signs its authentication URL.
func (be *browserEnv) authURL() (v1alpha1.PollSession, string) {
	be.t.Helper()
	ps := be.createSession("")
	return ps, be.signedURL(ps, be.ext.String()+"/authorize")
}

// loginCallback logs idpUser in through authURL and returns the client
// (holding the backend's cookies) and the callback URL the identity
// provider redirected to, not yet followed.
func (be *browserEnv) loginCallback(authURL string) (*http.Client, *url.URL) {
	be.t.Helper()
	client := be.jar()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	back, err := be.idp.Login(ctx, client, authURL, idpUser.Name, idpUser.Password)
	if err != nil {
		be.t.Fatalf("login at the identity provider: %v", err)
	}
	return client, back
}

// sessionState returns the store's outcome of session id.
func (be *browserEnv) sessionState(id string) sessions.Outcome {
	be.t.Helper()
	return be.outcome(id)
}
