package oidcprovider_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
)

const redirectURI = "http://127.0.0.1:1/callback" // never contacted: Login stops before it

func setup(t *testing.T) (*oidcprovider.Provider, *oidc.Provider, *oauth2.Config) {
	t.Helper()
	p := oidcprovider.Start(t, oidcprovider.Options{
		RedirectURIs: []string{redirectURI},
		Users: []oidcprovider.User{
			{Name: "alice", Password: "correct horse", Email: "alice@example.com", Groups: []string{"devs", "ops"}},
			{Name: "bob", Password: "battery staple"},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := oidc.NewProvider(ctx, p.IssuerURL)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	return p, op, &oauth2.Config{
		ClientID:     p.ClientID,
		ClientSecret: p.ClientSecret,
		Endpoint:     op.Endpoint(),
		RedirectURL:  redirectURI,
		Scopes:       []string{oidc.ScopeOpenID, "email", "groups"},
	}
}

func TestLoginWithPKCEGivesVerifiableIDToken(t *testing.T) {
	p, op, oc := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	verifier := oauth2.GenerateVerifier()
	authURL := oc.AuthCodeURL("state-123", oauth2.S256ChallengeOption(verifier), oidc.Nonce("nonce-456"))
	back, err := p.Login(ctx, &http.Client{}, authURL, "alice", "correct horse")
	if err != nil {
		t.Fatalf("Login: %v", err)
	}
	if got := back.Query().Get("state"); got != "state-123" {
		t.Fatalf("state = %q, want state-123 (redirect %s)", got, back)
	}
	code := back.Query().Get("code")
	if code == "" {
		t.Fatalf("no code in redirect %s", back)
	}

	// The code is bound to the PKCE verifier: a wrong one is refused.
	if _, err := oc.Exchange(ctx, code, oauth2.VerifierOption(oauth2.GenerateVerifier())); err == nil {
		t.Fatal("exchange with a wrong PKCE verifier succeeded")
	}
	// oidc-provider revokes a code after a failed use, so log in again.
	back, err = p.Login(ctx, &http.Client{}, authURL, "alice", "correct horse")
	if err != nil {
		t.Fatalf("second Login: %v", err)
	}
	tok, err := oc.Exchange(ctx, back.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok || raw == "" {
		t.Fatal("token response has no id_token")
	}
	idt, err := op.Verifier(&oidc.Config{ClientID: p.ClientID}).Verify(ctx, raw)
	if err != nil {
		t.Fatalf("verify ID token: %v", err)
	}
	if idt.Issuer != p.IssuerURL || idt.Subject != "alice" || idt.Nonce != "nonce-456" {
		t.Fatalf("ID token iss=%q sub=%q nonce=%q", idt.Issuer, idt.Subject, idt.Nonce)
	}
	var claims struct {
		Email  string   `json:"email"`
		Groups []string `json:"groups"`
	}
	if err := idt.Claims(&claims); err != nil {
		t.Fatal(err)
	}
	if claims.Email != "alice@example.com" || !slices.Equal(claims.Groups, []string{"devs", "ops"}) {
		t.Fatalf("claims = %+v", claims)
	}

	// Another client's verifier (audience) refuses the same token.
	if _, err := op.Verifier(&oidc.Config{ClientID: "someone-else"}).Verify(ctx, raw); err == nil {
		t.Fatal("ID token accepted for another audience")
	}
}

func TestWrongPasswordFails(t *testing.T) {
	p, _, oc := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	authURL := oc.AuthCodeURL("s", oauth2.S256ChallengeOption(oauth2.GenerateVerifier()))

	for _, tc := range []struct{ user, password string }{
		{"alice", "battery staple"}, // bob's password
		{"alice", ""},
		{"mallory", "correct horse"},
	} {
		back, err := p.Login(ctx, &http.Client{}, authURL, tc.user, tc.password)
		if !errors.Is(err, oidcprovider.ErrLoginRefused) {
			t.Errorf("Login(%q, %q) = %v, %v; want ErrLoginRefused", tc.user, tc.password, back, err)
		}
	}
}

func TestPKCEIsRequired(t *testing.T) {
	p, _, oc := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	back, err := p.Login(ctx, &http.Client{}, oc.AuthCodeURL("s"), "alice", "correct horse")
	if err != nil {
		t.Fatalf("Login: %v", err)
	}
	if back.Query().Get("error") != "invalid_request" || back.Query().Get("code") != "" {
		t.Fatalf("without PKCE got redirect %s, want error=invalid_request", back)
	}
}

func TestDenyConsentGivesAccessDenied(t *testing.T) {
	p, _, oc := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	authURL := oc.AuthCodeURL("s", oauth2.S256ChallengeOption(oauth2.GenerateVerifier()))
	back, err := p.LoginAndDeny(ctx, &http.Client{}, authURL, "bob", "battery staple")
	if err != nil {
		t.Fatalf("LoginAndDeny: %v", err)
	}
	if back.Query().Get("error") != "access_denied" || back.Query().Get("state") != "s" {
		t.Fatalf("redirect %s, want error=access_denied with state", back)
	}
}
