package oidc

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// tokenIdP is a minimal identity provider for the fuzz target: discovery,
// keys, and a token endpoint that answers a code it was told about with
// an RS256 ID token carrying that code's nonce, and anything else with
// invalid_grant. The real provider (internal/localenv/oidcprovider) is
// used by the login tests; a fuzz target needs thousands of callbacks a
// second, which only an in-process fake serves.
type tokenIdP struct {
	srv *httptest.Server
	key *rsa.PrivateKey

	mu    sync.Mutex
	codes map[string]string // code -> nonce
	// extra claims go into every ID token issued, over the usual ones;
	// a nil value removes a claim.
	extra map[string]any
}

func newTokenIdP(t testing.TB) *tokenIdP {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &tokenIdP{key: key, codes: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{
			"issuer": p.srv.URL, "authorization_endpoint": p.srv.URL + "/auth", "token_endpoint": p.srv.URL + "/token",
			"jwks_uri": p.srv.URL + "/keys", "id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		b64 := base64.RawURLEncoding.EncodeToString
		json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
			"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1",
			"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
		}}})
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		nonce, ok := p.codes[r.PostFormValue("code")]
		delete(p.codes, r.PostFormValue("code"))
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		p.mu.Lock()
		extra := p.extra
		p.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 60, "id_token": p.idToken(t, nonce, extra)})
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *tokenIdP) idToken(t testing.TB, nonce string, extra map[string]any) string {
	b64 := base64.RawURLEncoding.EncodeToString
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "kid": "k1", "typ": "JWT"})
	now := time.Now()
	c := map[string]any{
		"iss": p.srv.URL, "sub": "alice", "aud": "backend", "nonce": nonce, "email": "alice@example.com",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	claims, _ := json.Marshal(c)
	signed := b64(header) + "." + b64(claims)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, p.key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + b64(sig)
}

// issue registers a code for nonce.
func (p *tokenIdP) issue(code, nonce string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.codes[code] = nonce
}

func (p *tokenIdP) forget(code string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.codes, code)
}

// FuzzFinishCallbackQuery: the login callback's query (and the browser's
// binding cookie) as a browser or an attacker sends it. In the query,
// {state} becomes a genuine state of a fresh login, {code} a code the
// identity provider honours for that login and {iss} the issuer URL.
//
// Properties: the flow state comes back exactly for the genuine state in
// the browser that began the login; the state is spent exactly when a
// user signed in, and a spent state never comes back; a login succeeds only
// with the genuine state, that browser, the honoured code, no error and
// no foreign iss, and with all of those it does succeed; what the
// identity provider's error parameters say is bounded and valid UTF-8.
func FuzzFinishCallbackQuery(f *testing.F) {
	idp := newTokenIdP(f)
	// A single-use set each iteration empties again, so that a long run
	// never fills the default bounded one.
	var (
		usedMu sync.Mutex
		used   = map[string]bool{}
	)
	useOnce := func(_ context.Context, _ []byte, key string) error {
		usedMu.Lock()
		defer usedMu.Unlock()
		if used[key] {
			return errors.New("used before")
		}
		used[key] = true
		return nil
	}
	a, err := New(Config{
		IssuerURL: idp.srv.URL, ClientID: "backend", ClientSecret: "secret", RedirectURL: "https://bind.example.com/callback",
		SigningKey: signingKey, HTTPClient: idp.srv.Client(), UseOnce: useOnce,
	})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := a.discover(f.Context(), true); err != nil {
		f.Fatal(err)
	}
	for _, s := range []struct {
		query  string
		cookie uint8
	}{
		{"state={state}&code={code}", 0},
		{"state={state}&code={code}&iss={iss}", 0},
		{"code={code}&state={state}&iss=https%3A%2F%2Fevil.example.com", 0},
		{"state={state}&code={code}", 1},
		{"state={state}&code={code}", 2},
		{"state={state}&code=other", 0},
		{"state={state}", 0},
		{"state={state}&error=access_denied&error_description=The+user+declined", 0},
		{"state={state}&error=" + strings.Repeat("x", 100) + "%ff&error_description=" + strings.Repeat("%C3%A9", 200), 0},
		{"state={state}x&code={code}", 0},
		{"state=e30.AAAA&code={code}", 0},
		{"state={state}&state=other&code={code}", 0},
		{"state={state};code={code}", 0},
		{"", 0},
	} {
		f.Add(s.query, s.cookie)
	}
	f.Fuzz(func(t *testing.T, query string, cookieMode uint8) {
		now := time.Now()
		verifier := randomString(32)
		p := statePayload{ID: randomString(16), Bind: bindingOf(verifier), Nonce: randomString(16), Exp: now.Add(time.Hour).Unix(), Data: []byte("flow-data")}
		p.Data = append(p.Data, p.ID...)
		state, err := signState(a.stateKeys[0], p)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			usedMu.Lock()
			delete(used, "oidc-state-"+p.ID)
			usedMu.Unlock()
		}()
		code := "code-" + p.ID
		idp.issue(code, p.Nonce)
		defer idp.forget(code)
		query = strings.NewReplacer("{state}", url.QueryEscape(state), "{code}", code, "{iss}", url.QueryEscape(idp.srv.URL)).Replace(query)

		r := httptest.NewRequest(http.MethodGet, "https://bind.example.com/callback", nil)
		r.URL.RawQuery = query
		cookieName := a.cfg.CookiePrefix + p.ID
		sameBrowser := false
		switch cookieMode % 3 {
		case 0:
			r.AddCookie(&http.Cookie{Name: cookieName, Value: verifier})
			sameBrowser = true
		case 1: // another browser: no cookie
		case 2:
			r.AddCookie(&http.Cookie{Name: cookieName, Value: randomString(32)})
		}
		w := httptest.NewRecorder()
		id, flow, err := a.Finish(w, r)

		q := r.URL.Query()
		genuine := q.Get("state") == state && sameBrowser
		if (flow != nil) != genuine {
			t.Fatalf("query %q, same browser %v: flow state %q, error %v", query, sameBrowser, flow, err)
		}
		if flow == nil {
			if err == nil {
				t.Fatalf("query %q: no flow state and no error", query)
			}
			return
		}
		if !bytes.Equal(flow, p.Data) {
			t.Fatalf("flow state %q, want %q", flow, p.Data)
		}
		if c := w.Result().Cookies(); len(c) != 1 || c[0].Name != cookieName || c[0].MaxAge >= 0 {
			t.Fatalf("query %q: the binding cookie is not cleared: %v", query, c)
		}
		var pe *ProviderError
		if errors.As(err, &pe) && (len(pe.Code) > 64 || len(pe.Description) > 256 || !utf8.ValidString(pe.Code) || !utf8.ValidString(pe.Description)) {
			t.Fatalf("provider error not bounded: %q %q", pe.Code, pe.Description)
		}
		ok := q.Get("error") == "" && (q.Get("iss") == "" || q.Get("iss") == idp.srv.URL) && q.Get("code") == code
		switch {
		case err == nil && !ok:
			t.Fatalf("query %q: login succeeded", query)
		case err != nil && ok:
			t.Fatalf("query %q: a genuine callback failed: %v", query, err)
		case err == nil && (id.Subject != "alice" || id.Issuer != idp.srv.URL):
			t.Fatalf("identity %+v", id)
		}

		// The state is spent exactly when a user signed in.
		usedMu.Lock()
		spent := used["oidc-state-"+p.ID]
		usedMu.Unlock()
		if spent != (err == nil) {
			t.Fatalf("query %q: error %v, state spent %v", query, err, spent)
		}
		// The same callback again, with the code honoured again (as a
		// provider that took a code twice would): a spent state signs
		// nobody in; one that signed nobody in fails as before.
		idp.issue(code, p.Nonce)
		w = httptest.NewRecorder()
		_, flow2, err2 := a.Finish(w, r)
		switch {
		case spent && (flow2 != nil || !errors.Is(err2, ErrStateUsed)):
			t.Fatalf("query %q replayed: flow %q, error %v; want ErrStateUsed", query, flow2, err2)
		case !spent && (flow2 == nil || err2 == nil):
			t.Fatalf("query %q replayed: flow %q, error %v; want the same failure", query, flow2, err2)
		}
	})
}
