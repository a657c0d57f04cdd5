package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

func TestPollPending(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	wantError(t, e.poll(ps), 403, "authorization_pending")
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(ps), 403, "authorization_pending")
}

func TestPollTooSoon(t *testing.T) {
	e := newEnv(t, envOpts{}) // pollInterval 2s, tolerance 250ms
	ps := e.createSession("")
	wantError(t, e.poll(ps), 403, "authorization_pending")

	e.clock.Advance(500 * time.Millisecond)
	resp := e.poll(ps)
	wantError(t, resp, 429, "slow_down")
	if ra := resp.Header.Get("Retry-After"); ra != "2" { // 1.25s left, rounded up
		t.Errorf("Retry-After %q, want 2", ra)
	}

	e.clock.Advance(1200 * time.Millisecond) // 1.7s after the last counted poll
	resp = e.poll(ps)
	wantError(t, resp, 429, "slow_down")
	if ra := resp.Header.Get("Retry-After"); ra != "1" { // 50ms left: at least 1
		t.Errorf("Retry-After %q, want 1", ra)
	}

	// 1.8s after the last counted poll: within the jitter tolerance.
	e.clock.Advance(100 * time.Millisecond)
	wantError(t, e.poll(ps), 403, "authorization_pending")
}

func TestPollTolerance(t *testing.T) {
	for interval, want := range map[time.Duration]time.Duration{
		2 * time.Second:        250 * time.Millisecond,
		5 * time.Second:        500 * time.Millisecond,
		400 * time.Millisecond: 200 * time.Millisecond,
		0:                      0,
	} {
		if got := pollTolerance(interval); got != want {
			t.Errorf("pollTolerance(%s) = %s, want %s", interval, got, want)
		}
	}
}

func TestPollReusedNonce(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	u := e.pollURL(ps)
	wantError(t, e.do("GET", u, nil), 403, "authorization_pending")
	e.clock.Advance(time.Minute)
	msg := wantError(t, e.do("GET", u, nil), 401, "invalid_signature")
	if !strings.Contains(msg, "nonce") {
		t.Errorf("message %q does not name the nonce", msg)
	}
}

// A session ID that is malformed, not this backend's, from a retired key or
// past its expiry is 410 expired_token: the client starts over.
func TestPollUnknownAndExpired(t *testing.T) {
	e := newEnv(t, envOpts{ttl: time.Minute})
	ghost := v1alpha1.PollSession{SessionID: "Zr7Q2mWbX9kLp3VtZr7Q2m", SessionSecret: strings.Repeat("k", 43)}
	wantError(t, e.poll(ghost), 410, "expired_token")

	// Well formed, with the secret its key derives, but the key is not
	// this backend's (another backend's, or one retired since).
	other, err := sessionkey.New(bytes.Repeat([]byte("o"), sessionkey.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	foreign := other.Issue(sessionkey.FlowPoll, "", e.clock.Now().Add(time.Minute))
	wantError(t, e.poll(v1alpha1.PollSession{SessionID: foreign.ID, SessionSecret: foreign.Secret}), 410, "expired_token")

	// The shape of an ID of this backend with its key, of a flow that
	// does not exist: not one of ours.
	ps := e.createSession("")
	raw, err := base64.RawURLEncoding.DecodeString(ps.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	raw[0] = 9
	bogus := base64.RawURLEncoding.EncodeToString(raw)
	wantError(t, e.poll(v1alpha1.PollSession{SessionID: bogus, SessionSecret: ps.SessionSecret}), 410, "expired_token")

	// A genuine session polled before its end, then at its end, and after
	// the grace period too.
	e.clock.Advance(time.Minute - 2*time.Second)
	wantError(t, e.poll(ps), 403, "authorization_pending")
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(ps), 410, "expired_token")
	e.clock.Advance(time.Hour)
	wantError(t, e.poll(ps), 410, "expired_token")
}

// At the session's end only a response first delivered before it is
// still served, for the rest of its grace period; one not delivered by
// then, and a pending session, are 410.
func TestPollAtTheSessionsEnd(t *testing.T) {
	e := newEnv(t, envOpts{ttl: time.Minute, limits: sessions.Limits{Grace: 30 * time.Second}})
	delivered, undelivered, pending := e.createSession(""), e.createSession(""), e.createSession("")
	response := []byte(`{"kind":"BindingResponse"}`)
	e.complete(delivered.SessionID, response)
	e.complete(undelivered.SessionID, response)
	e.clock.Advance(time.Minute - 10*time.Second)
	if resp := e.poll(delivered); resp.StatusCode != 200 {
		t.Fatalf("delivery before the end: %d", resp.StatusCode)
	}
	e.clock.Advance(10 * time.Second) // the end
	if b := readAll(t, e.poll(delivered)); string(b) != string(response) {
		t.Fatalf("after the end, 10s into the grace period of its delivery: %s", b)
	}
	wantError(t, e.poll(undelivered), 410, "expired_token")
	wantError(t, e.poll(pending), 410, "expired_token")
	e.clock.Advance(21 * time.Second) // 31s after the delivery
	wantError(t, e.poll(delivered), 410, "expired_token")
}

// A session issued by a key that was rotated out is 410; while the old key
// is still among the previous keys, its sessions go on.
func TestPollKeyRotation(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte("1"), 32), bytes.Repeat([]byte("2"), 32)
	keysOf := func(current []byte, previous ...[]byte) *sessionkey.Keys {
		k, err := sessionkey.New(current, previous...)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	before := newEnv(t, envOpts{keys: keysOf(oldKey)})
	ps := before.createSession("")
	during := newEnv(t, envOpts{keys: keysOf(newKey, oldKey)})
	wantError(t, during.poll(ps), 403, "authorization_pending")
	if fresh := during.createSession(""); fresh.SessionSecret == ps.SessionSecret || during.open(fresh.SessionID).Secret != fresh.SessionSecret {
		t.Error("the new key does not issue the new sessions")
	}
	after := newEnv(t, envOpts{keys: keysOf(newKey)})
	wantError(t, after.poll(ps), 410, "expired_token")
}

func TestPollBadSignature(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	fresh := func(mod func(u *url.URL)) string {
		u, _ := url.Parse(e.pollURL(ps))
		mod(u)
		return u.String()
	}
	setQ := func(k, v string) func(u *url.URL) {
		return func(u *url.URL) { q := u.Query(); q.Set(k, v); u.RawQuery = q.Encode() }
	}
	cases := map[string]string{
		"tampered signature": fresh(func(u *url.URL) {
			q := u.Query()
			h := []byte(q.Get("h"))
			h[3] ^= 1
			q.Set("h", string(h))
			u.RawQuery = q.Encode()
		}),
		"signature not base64": fresh(setQ("h", "!!!")),
		"wrong secret": func() string {
			other := ps
			other.SessionSecret = strings.Repeat("A", 43)
			return e.pollURL(other)
		}(),
		// Signed for the address the test server listens on, not for the
		// backend's external URL.
		"signed for another host": e.signedURL(ps, e.srv.URL+"/poll"),
		"signed for http":         e.signedURL(ps, "http://bind.example.com/poll"),
		"signed for another path": func() string {
			u, _ := url.Parse(e.signedURL(ps, e.ext.String()+"/authorize"))
			u.Path = "/poll"
			return u.String()
		}(),
		"parameter added after signing": fresh(func(u *url.URL) { u.RawQuery += "&tenant=x" }),
	}
	for name, u := range cases {
		t.Run(name, func(t *testing.T) {
			wantError(t, e.do("GET", u, nil), 401, "invalid_signature")
		})
	}
	// None of them counted as a poll: a good one right away is pending.
	wantError(t, e.poll(ps), 403, "authorization_pending")
}

func TestPollSignedExtraParametersAndBody(t *testing.T) {
	e := newEnv(t, envOpts{external: "https://Bind.Example.com:443/kb"})
	ps := e.createSession("")
	// Extra parameters and the external URL's default port and case.
	u := e.signedURL(ps, "https://bind.example.com/kb/poll?tenant=acme+corp%2Fdev&a=2&a=1")
	wantError(t, e.do("GET", u, nil), 403, "authorization_pending")

	// A body is signed too.
	e.clock.Advance(2 * time.Second)
	pu, _ := url.Parse("https://bind.example.com/kb/poll")
	signed, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", pu, []byte("ignored"))
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, e.do("GET", signed.String(), strings.NewReader("ignored")), 403, "authorization_pending")
	e.clock.Advance(2 * time.Second)
	signed, _ = protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", pu, []byte("ignored"))
	wantError(t, e.do("GET", signed.String(), strings.NewReader("changed")), 401, "invalid_signature")

	// But bounded.
	big := strings.Repeat("x", 5<<10)
	signed, _ = protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", pu, []byte(big))
	wantError(t, e.do("GET", signed.String(), strings.NewReader(big)), 413, "request_too_large")
}

func TestPollInvalidRequest(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	good, _ := url.Parse(e.pollURL(ps))
	q := good.Query()
	with := func(mod func(v url.Values)) string {
		v := url.Values{}
		for k, vs := range q {
			v[k] = append([]string(nil), vs...)
		}
		mod(v)
		return "/poll?" + v.Encode()
	}
	for name, target := range map[string]string{
		"no query":      "/poll",
		"missing s":     with(func(v url.Values) { v.Del("s") }),
		"missing n":     with(func(v url.Values) { v.Del("n") }),
		"missing h":     with(func(v url.Values) { v.Del("h") }),
		"empty h":       with(func(v url.Values) { v.Set("h", "") }),
		"two s":         with(func(v url.Values) { v.Add("s", ps.SessionID) }),
		"two n":         with(func(v url.Values) { v.Add("n", "bm9uY2UtMDAwMQbm9uY2UtMDAwMQ") }),
		"two h":         with(func(v url.Values) { v.Add("h", q.Get("h")) }),
		"short nonce":   with(func(v url.Values) { v.Set("n", "abc") }),
		"nonce symbols": with(func(v url.Values) { v.Set("n", "bm9uY2UtMDAwMQ/bm9uY2UtMDAwMQ") }),
		"long nonce":    with(func(v url.Values) { v.Set("n", strings.Repeat("n", 200)) }),
		"bad s":         with(func(v url.Values) { v.Set("s", "a b") }),
		"malformed":     "/poll?s=%zz&n=x&h=y",
		"semicolon":     "/poll?s=a;n=b",
	} {
		t.Run(name, func(t *testing.T) {
			wantError(t, e.do("GET", target, nil), 400, "invalid_request")
		})
	}
	// Nothing above spent the session's poll.
	wantError(t, e.poll(ps), 403, "authorization_pending")
}

func TestPollCompletedGraceThenGone(t *testing.T) {
	e := newEnv(t, envOpts{limits: sessions.Limits{Grace: 60 * time.Second}})
	ps := e.createSession("")
	wantError(t, e.poll(ps), 403, "authorization_pending")

	response := []byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"BindingResponse","authentication":{"oauth2CodeGrant":{"sid":"` +
		ps.SessionID + `","id":"https://issuer/alice"}},"kubeconfig":"YXBpVmVyc2lvbjogdjEK","requests":[]}`)
	e.complete(ps.SessionID, response)
	e.clock.Advance(2 * time.Second)
	for i := 0; i < 3; i++ {
		resp := e.poll(ps)
		b := readAll(t, resp)
		if resp.StatusCode != 200 || string(b) != string(response) {
			t.Fatalf("poll %d after completion: %d %s", i, resp.StatusCode, b)
		}
		wantCommonHeaders(t, resp)
		e.clock.Advance(20 * time.Second) // 0s, 20s, 40s into the grace period
	}
	if got := e.stored(); got[1] != 1 {
		t.Errorf("store holds %d deliveries, want the first one", got[1])
	}
	e.clock.Advance(time.Second) // 61s after the first delivery
	wantError(t, e.poll(ps), 410, "expired_token")
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(ps), 410, "expired_token")
}

// The grace period runs from the first delivery, whichever replica made
// it: another replica sharing the store (its own service, the same keys)
// serves the response within it and refuses it after it.
func TestPollGraceAcrossReplicas(t *testing.T) {
	e := newEnv(t, envOpts{limits: sessions.Limits{Grace: 60 * time.Second}})
	svc2 := newService(t, e.store, nil, e.key, 0, 60*time.Second, e.clock.Now)
	h2, err := New(Config{ExternalURL: e.ext, Sessions: svc2, Now: e.clock.Now,
		Parts: testParts(t, e.ext, svc2, nil, partsOpts{})})
	if err != nil {
		t.Fatal(err)
	}
	poll2 := func(ps v1alpha1.PollSession) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h2.ServeHTTP(w, httptest.NewRequest("GET", e.pollURL(ps), nil))
		return w
	}
	ps := e.createSession("")
	response := []byte(`{"kind":"BindingResponse"}`)
	e.complete(ps.SessionID, response)
	if resp := e.poll(ps); resp.StatusCode != 200 {
		t.Fatalf("first delivery: %d", resp.StatusCode)
	}
	e.clock.Advance(59 * time.Second)
	if w := poll2(ps); w.Code != 200 || w.Body.String() != string(response) {
		t.Fatalf("replica 2 within the grace period: %d %s", w.Code, w.Body)
	}
	e.clock.Advance(2 * time.Second)
	if w := poll2(ps); w.Code != 410 || !strings.Contains(w.Body.String(), "expired_token") {
		t.Fatalf("replica 2 after the grace period of replica 1's delivery: %d %s", w.Code, w.Body)
	}

	// The first delivery made by replica 2 counts on replica 1 too.
	ps = e.createSession("")
	e.complete(ps.SessionID, response)
	if w := poll2(ps); w.Code != 200 {
		t.Fatalf("first delivery on replica 2: %d %s", w.Code, w.Body)
	}
	e.clock.Advance(61 * time.Second)
	wantError(t, e.poll(ps), 410, "expired_token")
}

func TestPollDenied(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	e.deny(ps.SessionID, "user alice is not in an allowed group")
	msg := wantError(t, e.poll(ps), 403, "access_denied")
	if !strings.Contains(msg, "alice is not in an allowed group") {
		t.Errorf("message %q lacks the reason", msg)
	}
	// A denial is final: a later bind cannot complete it.
	if err := e.store.Complete(context.Background(), ps.SessionID, e.open(ps.SessionID).ExpiresAt, "kb-other", []byte(`{}`)); !errors.Is(err, sessions.ErrNotPending) {
		t.Errorf("Complete after Deny: %v, want ErrNotPending", err)
	}
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(ps), 403, "access_denied")
}

func TestPollTooManyNonces(t *testing.T) {
	e := newEnv(t, envOpts{limits: sessions.Limits{MaxNoncesPerSession: 3}, ttl: time.Minute})
	ps := e.createSession("")
	for i := 0; i < 3; i++ {
		wantError(t, e.poll(ps), 403, "authorization_pending")
		e.clock.Advance(2 * time.Second)
	}
	resp := e.poll(ps)
	wantError(t, resp, 429, "slow_down")
	if ra := resp.Header.Get("Retry-After"); ra != "54" { // until the session expires
		t.Errorf("Retry-After %q, want 54", ra)
	}
}

// A session whose poll state its owner had to evict under load is over:
// 410, for a used nonce as for a fresh one, never admitted again.
func TestPollSessionOver(t *testing.T) {
	e := newEnv(t, envOpts{limits: sessions.Limits{MaxPolledSessions: 1}})
	victim := e.createSession("")
	e.clock.Advance(2 * time.Second)
	later := e.createSession("")
	used := e.pollURL(victim)
	wantError(t, e.do("GET", used, nil), 403, "authorization_pending")
	wantError(t, e.poll(later), 403, "authorization_pending") // evicts the victim, which expires first
	e.clock.Advance(2 * time.Second)
	wantError(t, e.do("GET", used, nil), 410, "expired_token")
	wantError(t, e.poll(victim), 410, "expired_token")
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(later), 403, "authorization_pending")
}

// A session of the callback flow is nothing to poll: 410, even signed with
// the secret its key derives (which nobody outside knows).
func TestPollCallbackSessionNotPollable(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := callbackSession(e.svc, "http://127.0.0.1:1234/callback", "xyz123")
	if s.Flow != sessionkey.FlowCallback {
		t.Fatalf("callback session of flow %d", s.Flow)
	}
	wantError(t, e.poll(v1alpha1.PollSession{SessionID: s.ID, SessionSecret: s.Secret}), 410, "expired_token")
	wantError(t, e.poll(v1alpha1.PollSession{SessionID: s.ID, SessionSecret: ""}), 410, "expired_token")
}

func TestLogsKeepSecrets(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession(`{"clusterID":"aB3dE9"}`)
	u := e.pollURL(ps)
	wantError(t, e.do("GET", u, nil), 403, "authorization_pending")
	response := `{"kubeconfig":"c2VjcmV0LWt1YmVjb25maWc="}`
	e.complete(ps.SessionID, []byte(response))
	e.clock.Advance(2 * time.Second)
	if resp := e.poll(ps); resp.StatusCode != 200 {
		t.Fatalf("poll: %d", resp.StatusCode)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"path":"/poll"`) {
		t.Fatalf("no access log for /poll: %s", logs)
	}
	pu, _ := url.Parse(u)
	for _, secret := range []string{ps.SessionSecret, pu.Query().Get("h"), pu.Query().Get("n"), "c2VjcmV0LWt1YmVjb25maWc"} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q:\n%s", secret, logs)
		}
	}
}

// TestPollOverRealServerHost shows that the request's own Host header plays
// no part: the same signed URL works whatever Host the ingress sends.
func TestPollHostHeaderIgnored(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	resp := e.do("GET", e.pollURL(ps), nil, "Host", "internal.svc.cluster.local:8080")
	wantError(t, resp, 403, "authorization_pending")
	_ = http.StatusOK
}
