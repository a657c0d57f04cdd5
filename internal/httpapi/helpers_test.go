package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/clusterkey"
	"github.com/kbprovider/backend/internal/health"
	"github.com/kbprovider/backend/internal/hmac"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/longpoll"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/storetest"
	"github.com/kbprovider/backend/internal/testutil/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// testExternal is the public URL the tests' backend believes it has; the
// test server itself listens on loopback, as behind an ingress.
const testExternal = "https://bind.example.com"

type env struct {
	t       testing.TB
	ext     *url.URL
	store   *memory.Store
	clock   *storetest.Clock
	reg     *prometheus.Registry
	handler http.Handler
	srv     *httptest.Server
	logs    *procs.Buffer
	key     *clusterkey.Key
}

type envOpts struct {
	external string
	limits   sessions.Limits
	ttl      time.Duration
	interval time.Duration
	// login, if set, is the identity provider of a real browser part
	// (browser.Handler with the test catalog and a provisioner that
	// refuses); without it the backend has none.
	login     browser.Login
	readiness []health.Check
	// logLevel of the handler's logger (default debug: tests see all).
	logLevel *slog.Level
	// longPoll holds polls that ask to wait (nil: long polling off).
	longPoll *longpoll.Holder
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	if o.external == "" {
		o.external = testExternal
	}
	ext, err := url.Parse(o.external)
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	store := memory.New(o.limits, clock.Now)
	t.Cleanup(store.Close)
	logs := &procs.Buffer{}
	level := slog.LevelDebug
	if o.logLevel != nil {
		level = *o.logLevel
	}
	reg := prometheus.NewRegistry()
	key, err := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))
	var bh *browser.Handler
	if o.login != nil {
		bh = testBrowser(t, ext, store, key, o.login, &staticCatalog{}, logger, clock.Now)
	}
	h, err := New(Config{
		ClusterKey:   key,
		ExternalURL:  ext,
		PrettyName:   "MangoDB Inc.",
		PollInterval: o.interval,
		SessionTTL:   o.ttl,
		Store:        store,
		Logger:       logger,
		Metrics:      reg,
		Readiness:    o.readiness,
		Browser:      bh,
		Now:          clock.Now,
		LongPoll:     o.longPoll,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ext: ext, store: store, clock: clock, reg: reg, handler: h, logs: logs, key: key}
	if _, ok := t.(*testing.T); ok {
		e.srv = httptest.NewServer(h)
		t.Cleanup(e.srv.Close)
	}
	return e
}

// do sends a request to the test server. target is a path with query, or
// an absolute URL of the external host, which is sent to the test server
// unchanged otherwise (the way an ingress forwards it).
func (e *env) do(method, target string, body io.Reader, hdr ...string) *http.Response {
	e.t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		e.t.Fatal(err)
	}
	srvURL, _ := url.Parse(e.srv.URL)
	u.Scheme, u.Host = srvURL.Scheme, srvURL.Host
	req, err := http.NewRequest(method, u.String(), body)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// createSession creates a session over HTTP.
func (e *env) createSession(body string) v1alpha1.PollSession {
	e.t.Helper()
	resp := e.do("POST", strings.TrimSuffix(e.ext.Path, "/")+"/sessions", strings.NewReader(body))
	b := readAll(e.t, resp)
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("POST /sessions: %d %s", resp.StatusCode, b)
	}
	var ps v1alpha1.PollSession
	if err := json.Unmarshal(b, &ps); err != nil {
		e.t.Fatal(err)
	}
	return ps
}

// pollURL returns a poll URL for ps signed for the external URL.
func (e *env) pollURL(ps v1alpha1.PollSession) string {
	e.t.Helper()
	return e.signedURL(ps, e.ext.String()+"/poll")
}

func (e *env) signedURL(ps v1alpha1.PollSession, raw string) string {
	e.t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		e.t.Fatal(err)
	}
	signed, err := hmac.SignURL(ps.SessionSecret, ps.SessionID, "GET", u, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return signed.String()
}

// poll signs a fresh poll and sends it.
func (e *env) poll(ps v1alpha1.PollSession) *http.Response {
	e.t.Helper()
	return e.do("GET", e.pollURL(ps), nil)
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantError checks status, the common headers and the JSON error code, and
// returns the message.
func wantError(t testing.TB, resp *http.Response, status int, code string) string {
	t.Helper()
	b := readAll(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, b)
	}
	wantCommonHeaders(t, resp)
	var e v1alpha1.Error
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	if e.Error != code {
		t.Fatalf("error %q, want %q (message %q)", e.Error, code, e.Message)
	}
	if len(e.Message) < 10 {
		t.Fatalf("error message %q is not helpful", e.Message)
	}
	return e.Message
}

func wantCommonHeaders(t testing.TB, resp *http.Response) {
	t.Helper()
	if got := resp.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", got)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/json; charset=utf-8" {
		t.Errorf("Content-Type %q, want application/json; charset=utf-8", got)
	}
}

// testBrowser is the browser part of the handler tests: the real handler
// with the given identity provider and catalog, and a provisioner that
// refuses.
func testBrowser(t testing.TB, ext *url.URL, store sessions.Store, key *clusterkey.Key, login browser.Login,
	catalog browser.Catalog, logger *slog.Logger, now func() time.Time) *browser.Handler {
	t.Helper()
	bh, err := browser.New(browser.Config{
		ClusterKey:     key,
		ExternalURL:    ext,
		ProviderName:   "MangoDB Inc.",
		Store:          store,
		SessionTTL:     10 * time.Minute,
		Login:          login,
		Catalog:        catalog,
		Provisioner:    refusingProvisioner{},
		CookieHashKey:  []byte("0123456789abcdef0123456789abcdef-cookie-hash"),
		CookieBlockKey: []byte("0123456789abcdef"),
		Logger:         logger.With("component", "browser"),
		Now:            now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return bh
}
