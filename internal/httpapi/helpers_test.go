package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/fakes"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// testExternal is the public URL the tests' backend believes it has; the
// test server itself listens on loopback, as behind an ingress.
const testExternal = "https://bind.example.com"

type env struct {
	t     testing.TB
	ext   *url.URL
	store *memory.Store
	// svc is the session service both the API and the browser part use.
	svc     *lifecycle.Service
	keys    *sessionkey.Keys
	clock   *testutil.Clock
	reg     *prometheus.Registry
	handler http.Handler
	srv     *httptest.Server
	logs    *procs.Buffer
	key     *clusterkey.Key
}

// testSessionKey is the session key of the tests' backends; testClusterKey
// their cluster key.
var (
	testSessionKey = bytes.Repeat([]byte("s"), sessionkey.MinKeyLen)
	testClusterKey = bytes.Repeat([]byte("k"), 32)
)

// newService returns the session service of a test backend over store,
// with keys (nil: testSessionKey alone).
func newService(t testing.TB, store sessions.Store, keys *sessionkey.Keys, key *clusterkey.Key, ttl, grace time.Duration, now func() time.Time) *lifecycle.Service {
	t.Helper()
	if keys == nil {
		var err error
		if keys, err = sessionkey.New(testSessionKey); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := lifecycle.New(lifecycle.Config{Store: store, Keys: keys, ClusterKey: key,
		SessionTTL: ttl, Grace: grace, Now: now, Catalog: testCatalog, Provisioner: refusingProvisioner})
	if err != nil {
		t.Fatal(err)
	}
	return svc
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
	// keys derive the session IDs (default: testSessionKey alone).
	keys *sessionkey.Keys
	// wrap, if set, wraps the memory store the handler uses (env.store
	// stays the memory store underneath).
	wrap func(sessions.Store) sessions.Store
	// noCallbackFlow turns the callback flow off (Config.NoCallbackFlow).
	noCallbackFlow bool
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
	clock := testutil.ClockAt(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	store := memory.New(o.limits, clock.Now)
	logs := &procs.Buffer{}
	level := slog.LevelDebug
	if o.logLevel != nil {
		level = *o.logLevel
	}
	reg := prometheus.NewRegistry()
	key, err := clusterkey.New(testClusterKey)
	if err != nil {
		t.Fatal(err)
	}
	var used sessions.Store = store
	if o.wrap != nil {
		used = o.wrap(store)
	}
	if o.keys == nil {
		if o.keys, err = sessionkey.New(testSessionKey); err != nil {
			t.Fatal(err)
		}
	}
	svc := newService(t, used, o.keys, key, o.ttl, o.limits.Grace, clock.Now)
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))
	var bh *browser.Handler
	if o.login != nil {
		bh = testBrowser(t, ext, svc, o.login, logger, clock.Now)
	}
	h, err := New(Config{
		ExternalURL:  ext,
		PollInterval: o.interval,
		Sessions:     svc,
		Logger:       logger,
		Metrics:      reg,
		Readiness:    o.readiness,
		Parts: testParts(t, ext, svc, reg, partsOpts{browser: bh, interval: o.interval,
			noCallbackFlow: o.noCallbackFlow, longPoll: o.longPoll}),
		Now:      clock.Now,
		LongPoll: o.longPoll,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ext: ext, store: store, svc: svc, keys: o.keys, clock: clock, reg: reg, handler: h, logs: logs, key: key}
	if _, ok := t.(*testing.T); ok {
		e.srv = httptest.NewServer(h)
		t.Cleanup(e.srv.Close)
	}
	return e
}

// metricsText is the handler's registry in the text format that
// /metrics on the diagnostics listener serves.
func (e *env) metricsText() string {
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
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
	signed, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", u, nil)
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
// with the given identity provider (the session service binds with the
// test catalog and a provisioner that refuses).
func testBrowser(t testing.TB, ext *url.URL, svc *lifecycle.Service, login browser.Login,
	logger *slog.Logger, now func() time.Time) *browser.Handler {
	t.Helper()
	bh, err := browser.New(browser.Config{
		ExternalURL:     ext,
		ProviderName:    "MangoDB Inc.",
		Sessions:        svc,
		Login:           login,
		CookieHashKeys:  [][]byte{[]byte("0123456789abcdef0123456789abcdef")},
		CookieBlockKeys: [][]byte{[]byte("0123456789abcdef")},
		Logger:          logger.With("component", "browser"),
		Now:             now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return bh
}

// open opens session id with the backend's service.
func (e *env) open(id string) lifecycle.Session {
	e.t.Helper()
	sess, err := e.svc.Open(id)
	if err != nil {
		e.t.Fatalf("session %s: %v", id, err)
	}
	return sess
}

// complete records response as the outcome of session id, as a bind in
// the browser does.
func (e *env) complete(id string, response []byte) {
	e.t.Helper()
	if err := e.svc.Complete(context.Background(), e.open(id), fakes.ProvisionedNamespace, response); err != nil {
		e.t.Fatal(err)
	}
}

// deny denies session id with reason, as a cancel in the browser does.
func (e *env) deny(id, reason string) {
	e.t.Helper()
	if err := e.svc.Deny(context.Background(), e.open(id), reason); err != nil {
		e.t.Fatal(err)
	}
}

// outcome returns the store's outcome of session id.
func (e *env) outcome(id string) sessions.Outcome {
	e.t.Helper()
	o, err := e.store.Outcome(context.Background(), id)
	if err != nil {
		e.t.Fatalf("outcome of %s: %v", id, err)
	}
	return o
}

// stored returns what the store holds: outcomes, deliveries, marks.
func (e *env) stored() [3]int {
	o, d, m := e.store.Len()
	return [3]int{o, d, m}
}
