package httpapi

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/clusterkey"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/sessions/storetest"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// POST /sessions is paced per client: the burst (3 s worth) is answered
// 201, the next 429 slow_down with Retry-After; another client (another
// IPv4 address, another IPv6 /64) is unaffected, addresses in one /64
// share a bucket, and the bucket refills with time.
func TestSessionCreateRateLimit(t *testing.T) {
	clock := storetest.NewClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
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
	h, err := New(Config{
		ExternalURL:       ext,
		Sessions:          newService(t, memory.New(sessions.Limits{}, clock.Now), keys, key, 0, 0, clock.Now),
		Metrics:           reg,
		Now:               clock.Now,
		SessionCreateRate: 2, // burst 6
	})
	if err != nil {
		t.Fatal(err)
	}
	post := func(remote string) *http.Response {
		r := httptest.NewRequest("POST", "/sessions", strings.NewReader("{}"))
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
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

	if n := counterValue(t, reg, "kube_bind_backend_sessions_rate_limited_total"); n != 5 {
		t.Errorf("sessions_rate_limited_total %v, want 5", n)
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
		l.allow(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), now)
	}
	if n := l.len(); n != 100 {
		t.Fatalf("%d clients remembered, want 100", n)
	}
	if newClientLimiter(0, 100) != nil {
		t.Fatal("rate 0 is no limit")
	}
}
