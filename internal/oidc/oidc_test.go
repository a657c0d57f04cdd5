package oidc

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gooidc "github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil"
)

type result struct {
	id   Identity
	data []byte
	err  error
}

// env is a backend-like test server (/login calls Begin, /callback calls
// Finish) in front of a real identity provider.
type env struct {
	t       *testing.T
	srv     *httptest.Server
	op      *oidcprovider.Provider
	auth    atomic.Pointer[Authenticator]
	clock   *testutil.Clock
	results chan result
}

var signingKey = []byte("0123456789abcdef0123456789abcdef-test-key")

func newEnv(t *testing.T) *env {
	e := &env{t: t, results: make(chan result, 10)}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		to, err := e.auth.Load().Begin(w, r, []byte(r.URL.Query().Get("data")))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if r.URL.Query().Get("nonce") != "" { // a test's way to make the IdP put another nonce in the token
			u, _ := url.Parse(to)
			q := u.Query()
			q.Set("nonce", r.URL.Query().Get("nonce"))
			u.RawQuery = q.Encode()
			to = u.String()
		}
		http.Redirect(w, r, to, http.StatusSeeOther)
	})
	mux.HandleFunc("/callback", func(w http.ResponseWriter, r *http.Request) {
		id, data, err := e.auth.Load().Finish(w, r)
		e.results <- result{id, data, err}
		w.WriteHeader(http.StatusOK)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	e.op = oidcprovider.Start(t, oidcprovider.Options{
		RedirectURIs: []string{e.srv.URL + "/callback"},
		Users: []oidcprovider.User{
			{Name: "alice", Password: "alice-pw", Email: "alice@example.com", Groups: []string{"devs", "ops"}},
			{Name: "bob", Password: "bob-pw", Email: "bob@example.com"},
			// The same address, which the provider did not (or not
			// properly) say it verified.
			{Name: "mallory-absent", Password: "mallory-absent-pw", Email: "alice@example.com", NoEmailVerified: true},
			{Name: "mallory-false", Password: "mallory-false-pw", Email: "alice@example.com", EmailVerified: json.RawMessage(`false`)},
			{Name: "mallory-string", Password: "mallory-string-pw", Email: "alice@example.com", EmailVerified: json.RawMessage(`"true"`)},
			{Name: "mallory-string-false", Password: "mallory-string-false-pw", Email: "alice@example.com", EmailVerified: json.RawMessage(`"false"`)},
			{Name: "mallory-one", Password: "mallory-one-pw", Email: "alice@example.com", EmailVerified: json.RawMessage(`1`)},
			{Name: "mallory-null", Password: "mallory-null-pw", Email: "alice@example.com", EmailVerified: json.RawMessage(`null`)},
		},
	})
	return e
}

// use installs a fresh Authenticator configured by mod.
func (e *env) use(mod func(*Config)) *Authenticator {
	e.clock = testutil.RealClock()
	cfg := Config{
		IssuerURL:    e.op.IssuerURL,
		ClientID:     e.op.ClientID,
		ClientSecret: e.op.ClientSecret,
		RedirectURL:  e.srv.URL + "/callback",
		SigningKey:   signingKey,
		Clock:        e.clock.Now,
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.auth.Store(a)
	return a
}

func newBrowser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 20 * time.Second}
}

// login runs the browser part up to the redirect back to /callback.
func (e *env) login(browser *http.Client, user, password, query string) *url.URL {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	back, err := e.op.Login(ctx, browser, e.srv.URL+"/login?"+query, user, password)
	if err != nil {
		e.t.Fatalf("Login: %v", err)
	}
	return back
}

// callback delivers the redirect to /callback and returns what Finish said.
func (e *env) callback(browser *http.Client, u *url.URL) result {
	e.t.Helper()
	resp, err := browser.Get(u.String())
	if err != nil {
		e.t.Fatalf("GET callback: %v", err)
	}
	resp.Body.Close()
	select {
	case r := <-e.results:
		return r
	case <-time.After(20 * time.Second):
		e.t.Fatal("no result from /callback")
		return result{}
	}
}

func oidcCookies(browser *http.Client, u string) []*http.Cookie {
	pu, _ := url.Parse(u)
	var out []*http.Cookie
	for _, c := range browser.Jar.Cookies(pu) {
		if strings.HasPrefix(c.Name, "kbp_oidc_") {
			out = append(out, c)
		}
	}
	return out
}

func TestLoginAgainstRealProvider(t *testing.T) {
	e := newEnv(t)

	t.Run("happy path", func(t *testing.T) {
		e.use(nil)
		browser := newBrowser(t)
		// First hop by hand, to see what Begin sends.
		noFollow := *browser
		noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := noFollow.Get(e.srv.URL + "/login?data=session-42")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		setCookie := resp.Header.Get("Set-Cookie")
		for _, want := range []string{"kbp_oidc_", "Path=/", "HttpOnly", "SameSite=Lax", "Max-Age=600"} {
			if !strings.Contains(setCookie, want) {
				t.Errorf("Set-Cookie %q lacks %q", setCookie, want)
			}
		}
		if strings.Contains(setCookie, "Secure") {
			t.Errorf("Secure cookie on a plain-http backend: %q", setCookie)
		}
		authURL, _ := url.Parse(resp.Header.Get("Location"))
		q := authURL.Query()
		if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("nonce") == "" || q.Get("state") == "" {
			t.Fatalf("authorization URL lacks PKCE S256, nonce or state: %s", authURL)
		}
		if strings.Contains(authURL.String(), "session-42") {
			t.Fatal("flow state readable in clear in the URL") // it is base64 in the signed state, not a query value
		}

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		back, err := e.op.Login(ctx, browser, authURL.String(), "alice", "alice-pw")
		if err != nil {
			t.Fatal(err)
		}
		r := e.callback(browser, back)
		if r.err != nil {
			t.Fatalf("Finish: %v", r.err)
		}
		want := Identity{Issuer: e.op.IssuerURL, Subject: "alice", Email: "alice@example.com", Groups: []string{"devs", "ops"}}
		if r.id.Issuer != want.Issuer || r.id.Subject != want.Subject || r.id.Email != want.Email || !slices.Equal(r.id.Groups, want.Groups) {
			t.Fatalf("identity = %+v, want %+v", r.id, want)
		}
		if string(r.data) != "session-42" {
			t.Fatalf("flow state = %q", r.data)
		}
		if c := oidcCookies(browser, e.srv.URL); len(c) != 0 {
			t.Fatalf("browser-binding cookie not cleared: %v", c)
		}
	})

	t.Run("secure cookies", func(t *testing.T) {
		e.use(func(c *Config) { c.SecureCookies = true })
		rec := httptest.NewRecorder()
		if _, err := e.auth.Load().Begin(rec, httptest.NewRequest("GET", "/login", nil), nil); err != nil {
			t.Fatal(err)
		}
		if sc := rec.Header().Get("Set-Cookie"); !strings.Contains(sc, "; Secure") {
			t.Fatalf("Set-Cookie %q lacks Secure", sc)
		}
	})

	t.Run("forged state", func(t *testing.T) {
		e.use(nil)
		browser := newBrowser(t)
		back := e.login(browser, "alice", "alice-pw", "data=victim")
		state := back.Query().Get("state")
		enc, sig, _ := strings.Cut(state, ".")

		// The attacker's own payload, signed with a key of their own.
		p, err := parseState(e.auth.Load().stateKeys, state, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		p.Data = []byte("attacker")
		otherKey, _ := signState([]byte("not-the-backend-key-0123456789abcdef"), p)
		flipped := []byte(sig)
		flipped[3] ^= 1
		for name, forged := range map[string]string{
			"other key":        otherKey,
			"flipped sig byte": enc + "." + string(flipped),
			"payload swapped":  strings.Split(otherKey, ".")[0] + "." + sig,
			"no signature":     enc,
			"garbage":          "%%%",
			"empty":            "",
			"huge":             strings.Repeat("a", 10000) + "." + sig,
		} {
			u := *back
			q := u.Query()
			q.Set("state", forged)
			u.RawQuery = q.Encode()
			if r := e.callback(browser, &u); !errors.Is(r.err, ErrInvalidState) || r.data != nil {
				t.Errorf("%s: Finish = %v, data %q; want ErrInvalidState and no data", name, r.err, r.data)
			}
		}
		// The genuine state still works: forgeries consumed nothing.
		if r := e.callback(browser, back); r.err != nil || string(r.data) != "victim" {
			t.Fatalf("genuine callback after forgeries: %v", r.err)
		}
	})

	t.Run("replayed state", func(t *testing.T) {
		e.use(nil)
		browser := newBrowser(t)
		back := e.login(browser, "alice", "alice-pw", "")
		cookies := oidcCookies(browser, e.srv.URL)
		if len(cookies) != 1 {
			t.Fatalf("want one binding cookie, have %v", cookies)
		}
		if r := e.callback(browser, back); r.err != nil {
			t.Fatal(r.err)
		}
		// Replayed as is: the cookie is gone.
		if r := e.callback(browser, back); !errors.Is(r.err, ErrBrowserMismatch) {
			t.Fatalf("replay without cookie: %v, want ErrBrowserMismatch", r.err)
		}
		// Replayed with the cookie put back: the provider honours its
		// code once.
		srvURL, _ := url.Parse(e.srv.URL)
		browser.Jar.SetCookies(srvURL, cookies)
		if r := e.callback(browser, back); !errors.Is(r.err, ErrInvalidCallback) || r.err == nil {
			t.Fatalf("replay with cookie: %v, want ErrInvalidCallback (the code was used)", r.err)
		}
	})

	t.Run("state spent only after a sign-in", func(t *testing.T) {
		var spent []string
		used := map[string]bool{}
		e.use(func(c *Config) {
			c.UseOnce = func(_ context.Context, _ []byte, key string) error {
				spent = append(spent, key)
				if used[key] {
					return errors.New("used before")
				}
				used[key] = true
				return nil
			}
		})
		// Nobody signs in: the identity provider's error, forged or
		// genuine, a missing or bad code: nothing is spent.
		browser := newBrowser(t)
		back := e.login(browser, "alice", "alice-pw", "data=d")
		cookies := oidcCookies(browser, e.srv.URL)
		srvURL, _ := url.Parse(e.srv.URL)
		for _, edit := range []func(url.Values){
			func(q url.Values) { q.Del("code"); q.Set("error", "access_denied") },
			func(q url.Values) { q.Del("code") },
			func(q url.Values) { q.Set("code", "made-up") },
		} {
			u := *back
			q := u.Query()
			edit(q)
			u.RawQuery = q.Encode()
			browser.Jar.SetCookies(srvURL, cookies)
			if r := e.callback(browser, &u); r.err == nil || string(r.data) != "d" {
				t.Fatalf("callback %s: %v (data %q), want an error with the flow state", u.RawQuery, r.err, r.data)
			}
		}
		if len(spent) != 0 {
			t.Fatalf("callbacks that signed nobody in spent %v", spent)
		}
		// The genuine callback then signs alice in and spends the state.
		browser.Jar.SetCookies(srvURL, cookies)
		if r := e.callback(browser, back); r.err != nil || r.id.Subject != "alice" {
			t.Fatalf("genuine callback after the failures: %v", r.err)
		}
		if len(spent) != 1 {
			t.Fatalf("a sign-in spent %v, want one key", spent)
		}
		// A state whose mark is spent signs nobody in, even with a code
		// the provider honours (a provider that took a code twice).
		e.use(func(c *Config) {
			c.UseOnce = func(context.Context, []byte, string) error { return errors.New("used before") }
		})
		browser = newBrowser(t)
		back = e.login(browser, "alice", "alice-pw", "data=d")
		if r := e.callback(browser, back); !errors.Is(r.err, ErrStateUsed) || r.data != nil || r.id.Subject != "" {
			t.Fatalf("spent state: %v (data %q, identity %+v), want ErrStateUsed and nothing else", r.err, r.data, r.id)
		}
	})

	t.Run("state from another browser", func(t *testing.T) {
		e.use(nil)
		victim := newBrowser(t)
		back := e.login(victim, "alice", "alice-pw", "data=x")
		// Another browser with its own binding cookie of another flow.
		attacker := newBrowser(t)
		e.login(attacker, "bob", "bob-pw", "")
		if r := e.callback(attacker, back); !errors.Is(r.err, ErrBrowserMismatch) || r.data != nil {
			t.Fatalf("Finish in another browser: %v, want ErrBrowserMismatch", r.err)
		}
		// A cookie of the right name but another value does not do either.
		srvURL, _ := url.Parse(e.srv.URL)
		c := oidcCookies(victim, e.srv.URL)[0]
		attacker.Jar.SetCookies(srvURL, []*http.Cookie{{Name: c.Name, Value: oauth2.GenerateVerifier(), Path: "/"}})
		if r := e.callback(attacker, back); !errors.Is(r.err, ErrBrowserMismatch) {
			t.Fatalf("Finish with a guessed cookie: %v, want ErrBrowserMismatch", r.err)
		}
		if r := e.callback(victim, back); r.err != nil {
			t.Fatalf("the right browser then: %v", r.err)
		}
	})

	t.Run("expired state", func(t *testing.T) {
		e.use(func(c *Config) { c.StateTTL = 5 * time.Minute })
		browser := newBrowser(t)
		back := e.login(browser, "alice", "alice-pw", "")
		e.clock.Advance(5*time.Minute + time.Second)
		if r := e.callback(browser, back); !errors.Is(r.err, ErrStateExpired) || r.data != nil {
			t.Fatalf("Finish after TTL: %v, want ErrStateExpired", r.err)
		}
	})

	t.Run("ID token with another nonce", func(t *testing.T) {
		e.use(nil)
		browser := newBrowser(t)
		back := e.login(browser, "alice", "alice-pw", "data=d&nonce=attacker-nonce")
		r := e.callback(browser, back)
		if !errors.Is(r.err, ErrLoginFailed) || !strings.Contains(r.err.Error(), "nonce") {
			t.Fatalf("Finish with a foreign nonce: %v, want ErrLoginFailed about the nonce", r.err)
		}
	})

	t.Run("callback without code or from another issuer", func(t *testing.T) {
		e.use(nil)
		for name, edit := range map[string]func(url.Values){
			"no code":       func(q url.Values) { q.Del("code") },
			"other issuer":  func(q url.Values) { q.Set("iss", "https://evil.example.com") },
			"code tampered": func(q url.Values) { q.Set("code", q.Get("code")+"x") },
		} {
			browser := newBrowser(t)
			back := e.login(browser, "alice", "alice-pw", "data=d")
			q := back.Query()
			edit(q)
			back.RawQuery = q.Encode()
			r := e.callback(browser, back)
			// A tampered code is refused by the provider (invalid_grant):
			// the callback's mistake like the others.
			want := ErrInvalidCallback
			if !errors.Is(r.err, want) || string(r.data) != "d" {
				t.Errorf("%s: %v (data %q), want %v with the flow state", name, r.err, r.data, want)
			}
		}
	})

	t.Run("user declines at the identity provider", func(t *testing.T) {
		e.use(nil)
		browser := newBrowser(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		back, err := e.op.LoginAndDeny(ctx, browser, e.srv.URL+"/login?data=s1", "bob", "bob-pw")
		if err != nil {
			t.Fatal(err)
		}
		r := e.callback(browser, back)
		var pe *ProviderError
		if !errors.As(r.err, &pe) || pe.Code != "access_denied" || string(r.data) != "s1" {
			t.Fatalf("Finish after deny: %v (data %q), want ProviderError access_denied with the flow state", r.err, r.data)
		}
	})

	t.Run("allow-lists", func(t *testing.T) {
		for _, tc := range []struct {
			name          string
			users, groups []string
			user          string
			allowed       bool
		}{
			{"group member", nil, []string{"ops"}, "alice", true},
			{"not in group", nil, []string{"ops"}, "bob", false},
			{"listed subject", []string{"bob"}, nil, "bob", true},
			{"unlisted subject", []string{"bob"}, nil, "alice", false},
			{"listed email", []string{"alice@example.com"}, []string{"admins"}, "alice", true},
			{"neither", []string{"carol"}, []string{"admins"}, "bob", false},
			// An e-mail entry matches only an address the ID token marks
			// email_verified: true (the JSON boolean).
			{"listed email, email_verified absent", []string{"alice@example.com"}, nil, "mallory-absent", false},
			{"listed email, email_verified false", []string{"alice@example.com"}, nil, "mallory-false", false},
			{`listed email, email_verified "true"`, []string{"alice@example.com"}, nil, "mallory-string", false},
			{`listed email, email_verified "false"`, []string{"alice@example.com"}, nil, "mallory-string-false", false},
			{"listed email, email_verified 1", []string{"alice@example.com"}, nil, "mallory-one", false},
			{"listed email, email_verified null", []string{"alice@example.com"}, nil, "mallory-null", false},
			{"listed subject, email_verified absent", []string{"mallory-absent"}, nil, "mallory-absent", true},
		} {
			e.use(func(c *Config) { c.AllowedUsers, c.AllowedGroups = tc.users, tc.groups })
			browser := newBrowser(t)
			r := e.callback(browser, e.login(browser, tc.user, tc.user+"-pw", "data=s"))
			if tc.allowed && r.err != nil {
				t.Errorf("%s: %v, want allowed", tc.name, r.err)
			}
			if !tc.allowed && (!errors.Is(r.err, ErrAccessDenied) || string(r.data) != "s") {
				t.Errorf("%s: %v (data %q), want ErrAccessDenied with the flow state", tc.name, r.err, r.data)
			}
		}
	})

	t.Run("ID token checks", func(t *testing.T) {
		// A real ID token for our client, fetched directly.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		prov, err := gooidc.NewProvider(ctx, e.op.IssuerURL)
		if err != nil {
			t.Fatal(err)
		}
		oc := &oauth2.Config{ClientID: e.op.ClientID, ClientSecret: e.op.ClientSecret, Endpoint: prov.Endpoint(),
			RedirectURL: e.srv.URL + "/callback", Scopes: []string{"openid", "email", "groups"}}
		verifier := oauth2.GenerateVerifier()
		back, err := e.op.Login(ctx, newBrowser(t), oc.AuthCodeURL("x", oauth2.S256ChallengeOption(verifier), gooidc.Nonce("n-1")), "alice", "alice-pw")
		if err != nil {
			t.Fatal(err)
		}
		tok, err := oc.Exchange(ctx, back.Query().Get("code"), oauth2.VerifierOption(verifier))
		if err != nil {
			t.Fatal(err)
		}
		raw := tok.Extra("id_token").(string)

		a := e.use(nil)
		if id, _, err := a.verifyIDToken(ctx, prov, raw, "n-1"); err != nil || id.Subject != "alice" {
			t.Fatalf("genuine token: %+v, %v", id, err)
		}
		if _, _, err := a.verifyIDToken(ctx, prov, raw, "n-2"); !errors.Is(err, ErrLoginFailed) {
			t.Errorf("wrong nonce: %v", err)
		}
		e.clock.Advance(2 * time.Hour)
		if _, _, err := a.verifyIDToken(ctx, prov, raw, "n-1"); !errors.Is(err, ErrLoginFailed) || !strings.Contains(err.Error(), "expired") {
			t.Errorf("expired token: %v", err)
		}
		other := e.use(func(c *Config) { c.ClientID = "another-client" })
		if _, _, err := other.verifyIDToken(ctx, prov, raw, "n-1"); !errors.Is(err, ErrLoginFailed) || !strings.Contains(err.Error(), "audience") {
			t.Errorf("wrong audience: %v", err)
		}
		// Claims changed after signing: the signature no longer matches.
		parts := strings.Split(raw, ".")
		body, _ := base64.RawURLEncoding.DecodeString(parts[1])
		parts[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(body), `"alice"`, `"admin"`, 1)))
		if _, _, err := a.verifyIDToken(ctx, prov, strings.Join(parts, "."), "n-1"); !errors.Is(err, ErrLoginFailed) {
			t.Errorf("tampered token: %v", err)
		}
	})

	t.Run("discovery retried until the provider answers", func(t *testing.T) {
		var up atomic.Bool
		a := e.use(func(c *Config) {
			c.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if !up.Load() {
					return nil, errors.New("connection refused (test)")
				}
				return http.DefaultTransport.RoundTrip(r)
			})}
		})
		if err := a.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "oidc discovery failing") {
			t.Fatalf("Check before discovery: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() { a.Run(ctx); close(done) }()
		time.Sleep(100 * time.Millisecond)
		if err := a.Check(ctx); err == nil || !strings.Contains(err.Error(), "connection refused (test)") {
			t.Fatalf("Check while down: %v", err)
		}
		rec := httptest.NewRecorder()
		if _, err := a.Begin(rec, httptest.NewRequest("GET", "/login", nil), nil); !errors.Is(err, ErrNotReady) {
			t.Fatalf("Begin while down: %v", err)
		}
		if len(rec.Result().Cookies()) != 0 {
			t.Fatal("Begin set a cookie although it failed")
		}
		up.Store(true)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not finish after the provider came up")
		}
		if err := a.Check(ctx); err != nil {
			t.Fatalf("Check after discovery: %v", err)
		}
		browser := newBrowser(t)
		if r := e.callback(browser, e.login(browser, "bob", "bob-pw", "")); r.err != nil {
			t.Fatalf("login after late discovery: %v", r.err)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNewRefusesIncompleteConfig(t *testing.T) {
	good := Config{IssuerURL: "https://idp", ClientID: "c", ClientSecret: "s", RedirectURL: "https://b/callback", SigningKey: signingKey}
	if _, err := New(good); err != nil {
		t.Fatal(err)
	}
	short := good
	short.SigningKey = []byte("short")
	if _, err := New(short); err == nil {
		t.Error("short signing key accepted")
	}
	shortPrevious := good
	shortPrevious.PreviousSigningKeys = [][]byte{signingKey, []byte("short")}
	if _, err := New(shortPrevious); err == nil || !strings.Contains(err.Error(), "previous signing key 2") {
		t.Errorf("short previous signing key: %v", err)
	}
	noSecret := good
	noSecret.ClientSecret = ""
	if _, err := New(noSecret); err == nil || !strings.Contains(err.Error(), "ClientSecret") {
		t.Errorf("missing secret: %v", err)
	}
}

// A rotation of the signing key: a login begun on a replica with the old
// key (its state signed with it) finishes on a replica that has the new
// key and still the old one, not on one that has dropped the old key; a
// state signed with the new key is refused where only the old one is
// known.
func TestSigningKeyRotation(t *testing.T) {
	oldKey, newKey := signingKey, []byte("fedcba9876543210fedcba9876543210-new-key")
	auth := func(current []byte, previous ...[]byte) *Authenticator {
		t.Helper()
		a, err := New(Config{IssuerURL: "https://idp", ClientID: "c", ClientSecret: "s", RedirectURL: "https://b/callback",
			SigningKey: current, PreviousSigningKeys: previous})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	before, during, after := auth(oldKey), auth(newKey, oldKey), auth(newKey)
	now := time.Now()
	p := statePayload{ID: "id", Bind: bindingOf("cookie"), Nonce: "n", Exp: now.Add(time.Minute).Unix(), Data: []byte("flow")}
	sign := func(a *Authenticator) string {
		s, err := signState(a.stateKeys[0], p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	oldState, newState := sign(before), sign(during)
	if newState != sign(after) || oldState == newState {
		t.Fatal("states are not signed with the current key")
	}
	for _, c := range []struct {
		name  string
		a     *Authenticator
		state string
		ok    bool
	}{
		{"old state, [new, old]", during, oldState, true},
		{"new state, [new, old]", during, newState, true},
		{"old state, [new]", after, oldState, false},
		{"new state, [old]", before, newState, false},
	} {
		got, err := parseState(c.a.stateKeys, c.state, now)
		if c.ok && (err != nil || string(got.Data) != "flow") {
			t.Errorf("%s: %+v, %v", c.name, got, err)
		}
		if !c.ok && !errors.Is(err, ErrInvalidState) {
			t.Errorf("%s: %v, want ErrInvalidState", c.name, err)
		}
	}
}

// /readyz notices an identity provider that went away after start-up (the
// real provider, stopped), and however often it is asked, it asks the
// provider at most once per HealthInterval.
func TestReadinessNoticesIdPGone(t *testing.T) {
	op := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{"http://127.0.0.1:1/callback"}})
	var discoveryRequests atomic.Int64
	a, err := New(Config{
		IssuerURL: op.IssuerURL, ClientID: op.ClientID, ClientSecret: op.ClientSecret,
		RedirectURL: "http://127.0.0.1:1/callback", SigningKey: signingKey,
		HealthInterval: 300 * time.Millisecond,
		HTTPClient: &http.Client{Timeout: 5 * time.Second, Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/.well-known/openid-configuration") {
				discoveryRequests.Add(1)
			}
			return http.DefaultTransport.RoundTrip(r)
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a.Run(ctx) // returns once discovered
	if err := a.Check(ctx); err != nil {
		t.Fatalf("Check with the provider up: %v", err)
	}
	before := discoveryRequests.Load()
	start := time.Now()
	for i := 0; i < 200; i++ {
		if err := a.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// At most one look per interval begun during the burst, plus one.
	allowed := int64(time.Since(start)/(300*time.Millisecond)) + 1
	if n := discoveryRequests.Load() - before; n > allowed {
		t.Errorf("200 checks asked the provider %d times, want at most %d", n, allowed)
	}

	op.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := a.Check(ctx)
		if err != nil {
			if !strings.Contains(err.Error(), "not answering") {
				t.Errorf("Check after the provider went away: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Check still passes 30s after the identity provider went away")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
