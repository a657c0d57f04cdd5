package oidc

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// The e-mail allow-list matches only an address the identity provider
// says it verified: email_verified must be the JSON boolean true. Absent,
// false, a string, a number or null is not verified, and the
// subject or a group still lets the user in.
func TestEmailAllowListNeedsVerifiedAddress(t *testing.T) {
	idp := newTokenIdP(t)
	newAuth := func(users, groups []string) *Authenticator {
		a, err := New(Config{
			IssuerURL: idp.srv.URL, ClientID: "backend", ClientSecret: "secret", RedirectURL: "https://bind.example.com/callback",
			SigningKey: signingKey, HTTPClient: idp.srv.Client(), AllowedUsers: users, AllowedGroups: groups,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.discover(t.Context(), true); err != nil {
			t.Fatal(err)
		}
		return a
	}
	// login runs one callback for a token with the extra claims and
	// returns what Finish said.
	login := func(a *Authenticator, extra map[string]any) (Identity, error) {
		t.Helper()
		idp.mu.Lock()
		idp.extra = extra
		idp.mu.Unlock()
		verifier := randomString(32)
		p := statePayload{ID: randomString(16), Bind: bindingOf(verifier), Nonce: randomString(16),
			Exp: time.Now().Add(time.Hour).Unix(), Data: []byte("flow")}
		state, err := signState(a.stateKeys[0], p)
		if err != nil {
			t.Fatal(err)
		}
		code := "code-" + p.ID
		idp.issue(code, p.Nonce)
		r := httptest.NewRequest(http.MethodGet, "https://bind.example.com/callback?"+
			url.Values{"state": {state}, "code": {code}}.Encode(), nil)
		r.AddCookie(&http.Cookie{Name: a.cfg.CookiePrefix + p.ID, Value: verifier})
		id, _, err := a.Finish(httptest.NewRecorder(), r)
		return id, err
	}

	byEmail := newAuth([]string{"alice@example.com"}, []string{"admins"})
	for _, c := range []struct {
		name     string
		verified any // nil: the claim is absent
		allowed  bool
	}{
		{"true", true, true},
		{"absent", nil, false},
		{"false", false, false},
		{`string "true"`, "true", false},
		{`string "false"`, "false", false},
		{"number 1", 1, false},
		{"null", json.RawMessage("null"), false},
		{"object", map[string]any{"value": true}, false},
		{"list", []any{true}, false},
	} {
		extra := map[string]any{"email_verified": c.verified}
		id, err := login(byEmail, extra)
		switch {
		case c.allowed && err != nil:
			t.Errorf("email_verified %s: %v, want allowed", c.name, err)
		case !c.allowed && !errors.Is(err, ErrAccessDenied):
			t.Errorf("email_verified %s: %v (identity %+v), want ErrAccessDenied", c.name, err, id)
		}
	}

	// Subject and groups do not depend on the e-mail address at all.
	for _, c := range []struct {
		name          string
		users, groups []string
		extra         map[string]any
	}{
		{"subject, address unverified", []string{"alice"}, nil, map[string]any{"email_verified": false}},
		{"subject, no email_verified", []string{"alice"}, nil, map[string]any{"email_verified": nil}},
		{"group, address unverified", nil, []string{"ops"}, map[string]any{"email_verified": "false", "groups": []string{"ops"}}},
	} {
		if _, err := login(newAuth(c.users, c.groups), c.extra); err != nil {
			t.Errorf("%s: %v, want allowed", c.name, err)
		}
	}
}
