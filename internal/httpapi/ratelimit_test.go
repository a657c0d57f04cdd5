package httpapi

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// POST /sessions is paced per client: the burst (3 s worth) is answered
// 201, the next 429 slow_down with Retry-After; another client (another
// IPv4 address, another IPv6 /64) is unaffected, addresses in one /64
// share a bucket, and the bucket refills with time.
func TestSessionCreateRateLimit(t *testing.T) {
	clock := testutil.ClockAt(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	keys, err := sessionkey.New(testSessionKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := clusterkey.New(testClusterKey)
	if err != nil {
		t.Fatal(err)
	}
	ext, _ := url.Parse(testExternal)
	reg := prometheus.NewRegistry()
	svc := newService(t, memory.New(sessions.Limits{}, clock.Now), keys, key, 0, 0, clock.Now)
	h, err := New(Config{
		ExternalURL:       ext,
		Sessions:          svc,
		Metrics:           reg,
		Now:               clock.Now,
		SessionCreateRate: 2, // burst 6
		Parts:             testParts(t, ext, svc, reg, partsOpts{v1alpha2: true}),
	})
	if err != nil {
		t.Fatal(err)
	}
	postTo := func(path, remote string) *http.Response {
		r := httptest.NewRequest("POST", path, strings.NewReader("{}"))
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	post := func(remote string) *http.Response { return postTo("/sessions", remote) }
	want := func(resp *http.Response, status int, what string) {
		t.Helper()
		if resp.StatusCode != status {
			t.Fatalf("%s: status %d, want %d", what, resp.StatusCode, status)
		}
	}

	const a = "192.0.2.1:1000"
	for range 6 {
		want(post(a), 201, "within the burst")
	}
	resp := post(a)
	wantError(t, resp, 429, v1alpha1.ErrorSlowDown)
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1 (one token every 500ms)", ra)
	}
	// IPv4-mapped is the same client.
	want(post("[::ffff:192.0.2.1]:1001"), 429, "the same client, IPv4-mapped")

	// Other clients are unaffected.
	want(post("192.0.2.2:1000"), 201, "another IPv4 client")
	for range 6 {
		want(post("[2001:db8:1:2::1]:1000"), 201, "an IPv6 client within its burst")
	}
	want(post("[2001:db8:1:2:ffff::7]:1000"), 429, "another address of the same /64")
	want(post("[2001:db8:1:3::1]:1000"), 201, "another /64")

	// The bucket refills: a token every 500 ms, the full burst after 3 s.
	clock.Advance(500 * time.Millisecond)
	want(post(a), 201, "after 500ms")
	want(post(a), 429, "right after")
	clock.Advance(3 * time.Second)
	for range 6 {
		want(post(a), 201, "after 3s, the full burst again")
	}
	want(post(a), 429, "beyond the burst again")

	// POST /api/sessions (v1alpha2) draws from the same bucket.
	const c = "192.0.2.3:1000"
	for i := range 6 {
		want(postTo([]string{"/api/sessions", "/sessions"}[i%2], c), 201, "v1alpha2 and v1alpha1 sessions within the shared burst")
	}
	wantError(t, postTo("/api/sessions", c), 429, v1alpha1.ErrorSlowDown)
	want(postTo("/sessions", c), 429, "v1alpha1 after the shared burst")

	if n := counterValue(t, reg, "kube_bind_backend_sessions_rate_limited_total"); n != 7 {
		t.Errorf("sessions_rate_limited_total %v, want 7", n)
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// The map of buckets is bounded: beyond its size the least recently seen
// client is forgotten.
func TestClientLimiterBounded(t *testing.T) {
	l := newClientLimiter(1, 100)
	now := time.Now()
	for i := range 1000 {
		l.Allow(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), now)
	}
	if n := l.Len(); n != 100 {
		t.Fatalf("%d clients remembered, want 100", n)
	}
	if newClientLimiter(0, 100) != nil {
		t.Fatal("rate 0 is no limit")
	}
}

// The browser routes that create something share the bucket of POST
// /sessions: GET /authorize starts a login (a login state, and a poll
// link spends a nonce as a single-use mark), GET /callback spends the
// state (another mark) and asks the identity provider. A whole bind
// (session, authorize, callback) fits in the burst; beyond it they are
// answered 429 with Retry-After before anything is created, HEAD is not
// counted, and the bucket refills with time.
func TestLoginRoutesShareTheCreateRate(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{sessionCreateRate: 1})                        // burst 3
	ps, authURL := be.authURL()                                                      // 1
	client, back := be.loginCallback(authURL)                                        // 2: GET /authorize
	if resp, body := be.send(client, "GET", back.String()); resp.StatusCode >= 400 { // 3: GET /callback
		t.Fatalf("callback within the burst: %d %s", resp.StatusCode, body)
	}
	callbackLink := be.ext.String() + "/authorize?p=34567&s=cli-session&c=" + ps.ClusterID
	for _, u := range []string{be.signedURL(ps, be.ext.String()+"/authorize"), callbackLink, be.ext.String() + "/callback?state=x&code=y"} {
		resp, body := be.send(be.jar(), "GET", u)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "Try again in 1 s") {
			t.Errorf("GET %s beyond the burst: %d (Retry-After %q) %s, want 429", u, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	if resp, body := be.send(be.jar(), "HEAD", callbackLink); resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD of a callback link beyond the burst: %d %s, want 200 (creates nothing, not paced)", resp.StatusCode, body)
	}
	wantError(t, be.do("POST", "/sessions", nil), http.StatusTooManyRequests, v1alpha1.ErrorSlowDown)
	if n := counterValue(t, be.reg, "kube_bind_backend_logins_rate_limited_total"); n != 3 {
		t.Errorf("logins_rate_limited_total %v, want 3", n)
	}
	be.clock.Advance(time.Second)
	if resp, body := be.send(be.jar(), "GET", callbackLink); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a callback link a second later: %d %s, want 303 to the identity provider", resp.StatusCode, body)
	}
}
