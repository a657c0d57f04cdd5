// Package oidc logs a browser in at the provider's OpenID Connect identity
// provider: authorization code flow with PKCE S256, a signed single-use
// state bound to the browser by a cookie, an ID-token nonce, full ID-token
// verification and optional allow-lists. Discovery runs in the background
// and is never fatal: until it succeeds, Begin and Finish fail with
// ErrNotReady and the readiness Check says why.
package oidc

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	gooidc "github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// Config configures an Authenticator.
type Config struct {
	// IssuerURL of the identity provider, exactly as its discovery document says.
	IssuerURL    string
	ClientID     string
	ClientSecret string
	// RedirectURL is the backend's callback URL registered at the provider;
	// the handler serving it calls Finish.
	RedirectURL string
	// Scopes requested; default openid, email, profile, groups.
	Scopes []string
	// GroupsClaim names the ID-token claim holding the groups; default "groups".
	GroupsClaim string

	// SigningKey signs the state (the backend's current cookie signing
	// key); at least 32 bytes. A key derived from it is used, never the
	// key itself.
	SigningKey []byte
	// PreviousSigningKeys (during a rotation) still verify the states
	// they signed, so logins begun on a replica with the old key finish
	// on one with the new key; at least 32 bytes each.
	PreviousSigningKeys [][]byte
	// SecureCookies sets the Secure flag and puts HostCookiePrefix in front
	// of CookiePrefix; set it when the external URL is https.
	SecureCookies bool
	// CookiePrefix names the browser-binding cookies; default "kbp_oidc_",
	// "__Host-kbp_oidc_" with SecureCookies.
	CookiePrefix string
	// StateTTL is how long a user has at the identity provider; default 10m.
	StateTTL time.Duration

	// AllowedUsers and AllowedGroups restrict who may log in. When both are
	// empty everybody the identity provider accepts may; otherwise a user
	// must be listed in AllowedUsers (by subject, or by e-mail address
	// only when the ID token's email_verified is the boolean true) or be
	// in one of AllowedGroups. Prefer subjects and groups: an address is
	// only as good as the provider's verification of it.
	AllowedUsers  []string
	AllowedGroups []string

	// UseOnce marks a state as used and fails if it was used before; it is
	// given the flow state Begin was called with and a key unique to the
	// flow. Finish calls it only once a user signed in (code exchanged, ID
	// token verified), so strangers never reach it. Wire it to a store
	// shared by all replicas (e.g. the session store's UseOnce). When nil,
	// an in-process set is used, which is enough for a single replica
	// only.
	UseOnce func(ctx context.Context, flowState []byte, key string) error

	// HTTPClient talks to the identity provider; default: 10 s timeout.
	HTTPClient *http.Client
	// ExchangeTimeout bounds the code exchange and the ID-token check
	// (which may fetch the provider's keys) of one callback; default 10s.
	// A provider that does not answer in time is ErrIdPUnavailable: the
	// login can be tried again.
	ExchangeTimeout time.Duration
	// HealthInterval is how long Check trusts its last look at the
	// provider's discovery document (a failed look: at most 5 s); default
	// 30s. However often Check is called, the provider is asked at most
	// once per interval.
	HealthInterval time.Duration
	Logger         *slog.Logger
	// Clock, for tests; default time.Now. It also drives ID-token expiry.
	Clock func() time.Time
}

// Identity is who logged in.
type Identity struct {
	Issuer  string
	Subject string
	Email   string
	// EmailVerified: the ID token's email_verified is the boolean true.
	EmailVerified bool
	Groups        []string
}

var (
	// ErrNotReady: discovery of the identity provider has not succeeded yet.
	ErrNotReady = errors.New("identity provider not reachable yet")
	// ErrInvalidState: the state is missing, malformed or not signed by us.
	ErrInvalidState = errors.New("invalid login state")
	// ErrStateExpired: the user took longer than StateTTL.
	ErrStateExpired = errors.New("login state expired")
	// ErrStateUsed: the state was used before (a replay or a reload), or
	// UseOnce could not record it (the error wraps UseOnce's).
	ErrStateUsed = errors.New("login state already used")
	// ErrBrowserMismatch: the callback came to a browser that did not start the login.
	ErrBrowserMismatch = errors.New("login was started in another browser")
	// ErrInvalidCallback: the callback lacks a code, names another issuer,
	// or brings a code the identity provider refuses (invalid_grant): what
	// the browser brought is wrong, a client's mistake.
	ErrInvalidCallback = errors.New("invalid login callback")
	// ErrLoginFailed: the code exchange or the ID-token verification failed.
	ErrLoginFailed = errors.New("login failed")
	// ErrAccessDenied: the user is outside the allow-lists.
	ErrAccessDenied = errors.New("access denied")
	// ErrIdPUnavailable: the identity provider did not answer the code
	// exchange in time, could not be reached, or failed (5xx). Transient:
	// the login may be started again.
	ErrIdPUnavailable = errors.New("identity provider unavailable")
)

// ProviderError is an error the identity provider sent back instead of a
// code, e.g. access_denied when the user declined.
type ProviderError struct {
	Code        string
	Description string
}

func (e *ProviderError) Error() string {
	if e.Description == "" {
		return "identity provider answered " + e.Code
	}
	return fmt.Sprintf("identity provider answered %s: %s", e.Code, e.Description)
}

// Authenticator runs logins. Safe for concurrent use.
type Authenticator struct {
	cfg Config
	// stateKeys are derived from the signing keys, the current first:
	// it signs, and all of them verify.
	stateKeys [][]byte
	log       *slog.Logger

	mu       sync.Mutex
	provider *gooidc.Provider
	lastErr  error
	lastTry  time.Time

	// health caches the readiness Check's last look at the provider;
	// probeMu lets one Check at a time look.
	probeMu   sync.Mutex
	healthMu  sync.Mutex
	healthErr error
	healthAt  time.Time
}

// New checks cfg and returns an Authenticator. It does not contact the
// identity provider: call Run (in a goroutine) to discover it.
func New(cfg Config) (*Authenticator, error) {
	var missing []string
	for name, v := range map[string]string{"IssuerURL": cfg.IssuerURL, "ClientID": cfg.ClientID, "ClientSecret": cfg.ClientSecret, "RedirectURL": cfg.RedirectURL} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("oidc: missing configuration: %s", strings.Join(missing, ", "))
	}
	if len(cfg.SigningKey) < 32 {
		return nil, errors.New("oidc: the signing key must be at least 32 bytes")
	}
	for i, k := range cfg.PreviousSigningKeys {
		if len(k) < 32 {
			return nil, fmt.Errorf("oidc: previous signing key %d must be at least 32 bytes", i+1)
		}
	}
	if len(cfg.Scopes) == 0 {
		cfg.Scopes = []string{gooidc.ScopeOpenID, "email", "profile", "groups"}
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.CookiePrefix == "" {
		cfg.CookiePrefix = "kbp_oidc_"
	}
	if cfg.SecureCookies && !strings.HasPrefix(cfg.CookiePrefix, HostCookiePrefix) {
		// Begin sets the cookie and Finish reads it under this one name.
		cfg.CookiePrefix = HostCookiePrefix + cfg.CookiePrefix
	}
	if cfg.StateTTL <= 0 {
		cfg.StateTTL = 10 * time.Minute
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.ExchangeTimeout <= 0 {
		cfg.ExchangeTimeout = 10 * time.Second
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = 30 * time.Second
	}
	if cfg.UseOnce == nil {
		cfg.UseOnce = newMemoryOnce(cfg.Clock, cfg.StateTTL, 100_000).use
	}
	var stateKeys [][]byte
	for _, k := range append([][]byte{cfg.SigningKey}, cfg.PreviousSigningKeys...) {
		m := hmac.New(sha256.New, k)
		m.Write([]byte("kube-bind-backend oidc state key"))
		stateKeys = append(stateKeys, m.Sum(nil))
	}
	return &Authenticator{
		cfg:       cfg,
		stateKeys: stateKeys,
		log:       cfg.Logger,
		lastErr:   errors.New("not tried yet"),
	}, nil
}

// Run discovers the identity provider, retrying with backoff (1 s doubling
// to 1 min) until it succeeds or ctx ends. It never gives up on its own.
func (a *Authenticator) Run(ctx context.Context) {
	backoff := time.Second
	for {
		_, err := a.discover(ctx, true)
		if err == nil {
			return
		}
		a.log.Warn("oidc discovery failing, will retry", "issuer", a.cfg.IssuerURL, "error", err, "retryIn", backoff)
		jitter := time.Duration(rand.Int64N(int64(backoff / 4)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + jitter):
		}
		backoff = min(backoff*2, time.Minute)
	}
}

// Name is the readiness check's name.
func (a *Authenticator) Name() string { return "oidc" }

// Check reports whether the identity provider was discovered and, since
// then, still answers: it fetches the discovery document again when its
// last look is older than HealthInterval (5 s after a failure), one
// request at a time, and otherwise answers from that look. So the
// dependency monitor notices a provider that went away after start-up
// without hammering it.
func (a *Authenticator) Check(ctx context.Context) error {
	a.mu.Lock()
	discovered, lastErr := a.provider != nil, a.lastErr
	a.mu.Unlock()
	if !discovered {
		return fmt.Errorf("oidc discovery failing: %w", lastErr)
	}
	if err, fresh := a.cachedHealth(); fresh {
		return err
	}
	a.probeMu.Lock()
	defer a.probeMu.Unlock()
	if err, fresh := a.cachedHealth(); fresh { // another Check just looked
		return err
	}
	err := a.probe(ctx)
	a.healthMu.Lock()
	a.healthErr, a.healthAt = err, time.Now()
	a.healthMu.Unlock()
	if err != nil {
		a.log.Warn("identity provider not answering", "issuer", a.cfg.IssuerURL, "error", err)
	}
	return err
}

func (a *Authenticator) cachedHealth() (error, bool) {
	a.healthMu.Lock()
	defer a.healthMu.Unlock()
	if a.healthAt.IsZero() {
		return nil, false
	}
	ttl := a.cfg.HealthInterval
	if a.healthErr != nil {
		ttl = min(ttl, 5*time.Second)
	}
	return a.healthErr, time.Since(a.healthAt) < ttl
}

// recheckHealth makes the next Check look at the provider again, after a
// login found it unavailable.
func (a *Authenticator) recheckHealth() {
	a.healthMu.Lock()
	a.healthAt = time.Time{}
	a.healthMu.Unlock()
}

// probe fetches the provider's discovery document.
func (a *Authenticator) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	u := strings.TrimSuffix(a.cfg.IssuerURL, "/") + "/.well-known/openid-configuration"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("identity provider not answering: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("identity provider not answering: discovery document: %s", resp.Status)
	}
	return nil
}

// discover returns the provider, discovering it now if needed. Requests
// (force=false) try at most once a second, so that a dead identity
// provider is not hammered by every browser.
func (a *Authenticator) discover(ctx context.Context, force bool) (*gooidc.Provider, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.provider != nil {
		return a.provider, nil
	}
	if !force && a.cfg.Clock().Sub(a.lastTry) < time.Second {
		return nil, fmt.Errorf("%w: %v", ErrNotReady, a.lastErr)
	}
	a.lastTry = a.cfg.Clock()
	ctx, cancel := context.WithTimeout(gooidc.ClientContext(ctx, a.cfg.HTTPClient), 10*time.Second)
	defer cancel()
	p, err := gooidc.NewProvider(ctx, a.cfg.IssuerURL)
	if err != nil {
		a.lastErr = err
		return nil, fmt.Errorf("%w: %v", ErrNotReady, err)
	}
	a.provider = p
	a.log.Info("oidc discovery done", "issuer", a.cfg.IssuerURL)
	return p, nil
}

func (a *Authenticator) oauth2Config(p *gooidc.Provider) *oauth2.Config {
	return &oauth2.Config{
		ClientID:     a.cfg.ClientID,
		ClientSecret: a.cfg.ClientSecret,
		Endpoint:     p.Endpoint(),
		RedirectURL:  a.cfg.RedirectURL,
		Scopes:       a.cfg.Scopes,
	}
}
