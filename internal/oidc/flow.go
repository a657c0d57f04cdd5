package oidc

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	gooidc "github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// Begin starts a login: it sets the browser-binding cookie on w and returns
// the identity provider's URL to redirect the browser to. flowState is
// opaque data (at most 1 KiB) that Finish gives back; it travels signed but
// readable through the browser, so it must hold no secrets (a session ID is
// fine). Errors: ErrNotReady while the identity provider is not discovered.
func (a *Authenticator) Begin(w http.ResponseWriter, r *http.Request, flowState []byte) (string, error) {
	if len(flowState) > maxFlowState {
		return "", errFlowStateTooLarge
	}
	p, err := a.discover(r.Context(), false)
	if err != nil {
		return "", err
	}
	// The verifier doubles as the cookie's value: it stays between this
	// browser and the backend, and only its hash goes into the state.
	verifier := oauth2.GenerateVerifier()
	now := a.cfg.Clock()
	payload := statePayload{
		ID:    randomString(16),
		Bind:  bindingOf(verifier),
		Nonce: randomString(16),
		Exp:   now.Add(a.cfg.StateTTL).Unix(),
		Data:  flowState,
	}
	state, err := signState(a.stateKeys[0], payload)
	if err != nil {
		return "", err
	}
	http.SetCookie(w, a.cookie(payload.ID, verifier, int(a.cfg.StateTTL.Seconds())))
	return a.oauth2Config(p).AuthCodeURL(state, oauth2.S256ChallengeOption(verifier), gooidc.Nonce(payload.Nonce)), nil
}

// Finish completes a login on the callback request r: it checks the state
// (signature, expiry, this browser's cookie), clears the cookie, exchanges
// the code with the PKCE verifier, verifies the ID token (signature,
// issuer, audience, expiry, nonce), spends the state (UseOnce) and applies
// the allow-lists.
//
// The state is spent only once a user has signed in (the code exchanged,
// the ID token verified), so a callback that signs nobody in writes
// nothing: a forged error callback costs the backend no record. A state
// still completes at most one login: the identity provider honours its
// code once, the code is bound to this browser's PKCE verifier, and the
// state is spent before a login counts.
//
// flowState is returned exactly when the state proved genuine and of
// this browser, also alongside these errors, after which nobody signed in
// and nothing was spent: *ProviderError (the identity provider sent an
// error, e.g. the user declined), ErrInvalidCallback, ErrLoginFailed, and
// the transient ErrIdPUnavailable (and ErrNotReady when the provider was
// never discovered), after which the caller may start a new login for the
// same flow state with Begin. With ErrAccessDenied the user signed in and
// the state is spent. flowState is nil with ErrInvalidState,
// ErrStateExpired, ErrBrowserMismatch and ErrStateUsed (which also wraps
// a failure of UseOnce itself).
func (a *Authenticator) Finish(w http.ResponseWriter, r *http.Request) (Identity, []byte, error) {
	q := r.URL.Query()
	p, err := parseState(a.stateKeys, q.Get("state"), a.cfg.Clock())
	if err != nil {
		return Identity{}, nil, err
	}
	c, err := r.Cookie(a.cfg.CookiePrefix + p.ID)
	if err != nil || !bindingMatches(p, c.Value) {
		return Identity{}, nil, ErrBrowserMismatch
	}
	http.SetCookie(w, a.cookie(p.ID, "", -1))

	if code := q.Get("error"); code != "" {
		return Identity{}, p.Data, &ProviderError{Code: truncate(code, 64), Description: truncate(q.Get("error_description"), 256)}
	}
	// RFC 9207: a provider that names itself must be ours (mix-up defence).
	if iss := q.Get("iss"); iss != "" && iss != a.cfg.IssuerURL {
		return Identity{}, p.Data, fmt.Errorf("%w: callback from issuer %q", ErrInvalidCallback, truncate(iss, 256))
	}
	code := q.Get("code")
	if code == "" || len(code) > 4096 {
		return Identity{}, p.Data, fmt.Errorf("%w: no code", ErrInvalidCallback)
	}
	prov, err := a.discover(r.Context(), false)
	if err != nil {
		return Identity{}, p.Data, err
	}
	// The exchange and the token check (which may fetch the provider's
	// keys) get a bounded time; the user waits on this request.
	ctx, cancel := context.WithTimeout(r.Context(), a.cfg.ExchangeTimeout)
	defer cancel()
	tok, err := a.oauth2Config(prov).Exchange(context.WithValue(ctx, oauth2.HTTPClient, a.cfg.HTTPClient), code, oauth2.VerifierOption(c.Value))
	if err != nil {
		var re *oauth2.RetrieveError
		switch {
		case errors.As(err, &re) && re.ErrorCode == "invalid_grant":
			// The code the browser brought is not good (made up, used
			// or expired): the callback's mistake, not the provider's.
			return Identity{}, p.Data, fmt.Errorf("%w: the identity provider refused the code (invalid_grant)", ErrInvalidCallback)
		case errors.As(err, &re) && re.Response != nil && re.Response.StatusCode < 500:
			// Refused for another reason (e.g. invalid_client): the
			// operator's configuration, not transient.
			return Identity{}, p.Data, fmt.Errorf("%w: code exchange: %v", ErrLoginFailed, err)
		default:
			// No answer in time, no connection, or a 5xx: transient.
			a.recheckHealth()
			return Identity{}, p.Data, fmt.Errorf("%w: code exchange: %v", ErrIdPUnavailable, err)
		}
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return Identity{}, p.Data, fmt.Errorf("%w: no ID token in the token response", ErrLoginFailed)
	}
	id, emailVerified, err := a.verifyIDToken(ctx, prov, raw, p.Nonce)
	if err != nil && ctx.Err() != nil {
		// The provider's keys did not come in time.
		a.recheckHealth()
		return Identity{}, p.Data, fmt.Errorf("%w: %v", ErrIdPUnavailable, err)
	}
	if err != nil {
		return Identity{}, p.Data, err
	}
	// Signed in: only now is the state worth a record.
	if err := a.cfg.UseOnce(r.Context(), p.Data, "oidc-state-"+p.ID); err != nil {
		return Identity{}, nil, fmt.Errorf("%w: %w", ErrStateUsed, err)
	}
	if !a.allowed(id, emailVerified) {
		a.log.Info("oidc login outside the allow-lists", "subject", id.Subject)
		return id, p.Data, fmt.Errorf("%w: %s is not among the allowed users or groups", ErrAccessDenied, id.Subject)
	}
	return id, p.Data, nil
}

// verifyIDToken verifies signature, issuer, audience, expiry (go-oidc), the
// nonce and, for several audiences, the authorized party.
func (a *Authenticator) verifyIDToken(ctx context.Context, prov *gooidc.Provider, raw, nonce string) (Identity, bool, error) {
	ctx = gooidc.ClientContext(ctx, a.cfg.HTTPClient)
	idt, err := prov.Verifier(&gooidc.Config{ClientID: a.cfg.ClientID, Now: a.cfg.Clock}).Verify(ctx, raw)
	if err != nil {
		return Identity{}, false, fmt.Errorf("%w: ID token: %v", ErrLoginFailed, err)
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 {
		return Identity{}, false, fmt.Errorf("%w: ID token nonce does not match", ErrLoginFailed)
	}
	var claims map[string]json.RawMessage
	if err := idt.Claims(&claims); err != nil {
		return Identity{}, false, fmt.Errorf("%w: ID token claims: %v", ErrLoginFailed, err)
	}
	if len(idt.Audience) > 1 {
		var azp string
		_ = json.Unmarshal(claims["azp"], &azp)
		if azp != a.cfg.ClientID {
			return Identity{}, false, fmt.Errorf("%w: ID token for several audiences without azp = our client", ErrLoginFailed)
		}
	}
	id := Identity{Issuer: idt.Issuer, Subject: idt.Subject}
	_ = json.Unmarshal(claims["email"], &id.Email)
	// The address counts as verified only when the provider says so with
	// the JSON boolean true: absent, false, "true", 1 or null is not
	// (OpenID Connect Core §5.1 makes email_verified a boolean; a
	// provider that leaves it out has not verified the address).
	var ev any
	emailVerified := json.Unmarshal(claims["email_verified"], &ev) == nil && ev == true
	// Groups come as a list, or from some providers as one string.
	if g, ok := claims[a.cfg.GroupsClaim]; ok {
		if json.Unmarshal(g, &id.Groups) != nil {
			var one string
			if json.Unmarshal(g, &one) == nil && one != "" {
				id.Groups = []string{one}
			}
		}
	}
	if id.Subject == "" {
		return Identity{}, false, fmt.Errorf("%w: ID token without subject", ErrLoginFailed)
	}
	id.EmailVerified = emailVerified
	return id, emailVerified, nil
}

func (a *Authenticator) allowed(id Identity, emailVerified bool) bool {
	id.EmailVerified = emailVerified
	return a.cfg.AllowList().Allows(id)
}

// HostCookiePrefix starts the name of every cookie the backend sets over
// https. A browser accepts a cookie so named only with Secure, Path=/ and
// no Domain, from the host itself: no other host of the domain (a sibling
// or the parent) can set, shadow or overwrite it. Over plain http (local
// development) browsers refuse such cookies, so the plain names are kept.
const HostCookiePrefix = "__Host-"

// cookie is the browser-binding cookie of login id. Path=/ and no Domain:
// a __Host- cookie needs both (HostCookiePrefix).
func (a *Authenticator) cookie(id, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name:     a.cfg.CookiePrefix + id,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   a.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode,
	}
}

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

func truncate(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
}
