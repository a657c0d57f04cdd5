package server

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/kbindv2"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	apiv1alpha1 "github.com/kbprovider/backend/internal/httpapi/v1alpha1"
	apiv1alpha2 "github.com/kbprovider/backend/internal/httpapi/v1alpha2"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// providerSide is the provider cluster as the backend binds on it: the
// exported APIs (catalog), the offers over them, and the provisioner,
// which sets consumers up and marks their responses delivered. All nil
// without an identity provider: nobody could sign in to bind.
type providerSide struct {
	catalog     *binding.Catalog
	provisioner *binding.Provisioner
	offers      *offers.Source
}

// newProviderSide builds the provider side.
func (s *Server) newProviderSide(ctx context.Context) (providerSide, error) {
	cfg := s.cfg
	if !cfg.OIDC.Enabled() {
		return providerSide{}, nil
	}
	rc, err := s.provider()
	if err != nil {
		return providerSide{}, err
	}
	if err := s.checkScopeAtStart(ctx, rc); err != nil {
		return providerSide{}, err
	}
	catalog, err := binding.NewCatalog(rc, cfg.Provider.ConsumerScope, binding.WithLogger(s.log.With("component", "catalog")))
	if err != nil {
		return providerSide{}, err
	}
	provisioner, err := binding.NewProvisioner(rc, catalog, binding.Config{
		NamespacePrefix:    cfg.Provider.NamespacePrefix,
		ProviderPrettyName: cfg.PrettyName,
		ExternalAddress:    cfg.Provider.ExternalAddress,
		ExternalCA:         cfg.Provider.ExternalCA,
		ExternalServerName: cfg.Provider.ExternalServerName,
		TokenLifetime:      cfg.Controllers.Credentials.Lifetime,
		Quota:              cfg.Provider.Quota,
		MaxClustersPerUser: cfg.Provider.MaxClustersPerUser,
	})
	if err != nil {
		return providerSide{}, err
	}
	// What v1alpha2 consumers may pick: the catalog's CRDs and the
	// provider's templates and collections.
	src, err := offers.New(rc, catalog, offers.Config{Logger: s.log.With("component", "offers")})
	if err != nil {
		return providerSide{}, err
	}
	s.loops = append(s.loops, loop{"catalog", catalog.Run}, loop{"offers", src.Run})
	return providerSide{catalog: catalog, provisioner: provisioner, offers: src}, nil
}

// bound says whether the provider side is there (an identity provider is
// configured).
func (p providerSide) bound() bool { return p.provisioner != nil }

// login is how users sign in: the identity provider login of the browser
// flows and the CLI tokens of `kubectl bind login`, with the readiness
// checks of this replica's caches and the dependencies every replica
// shares (the identity provider, the provider cluster). Empty without an
// identity provider.
type login struct {
	oidc   *oidc.Authenticator
	tokens *clitoken.Tokens
	// readiness: this replica's own caches; dependencies: what every
	// replica shares.
	readiness, dependencies []health.Check
}

// newLogin builds the login. Its login states are single-use marks in the
// session store.
func (s *Server) newLogin(p providerSide) (login, error) {
	cfg := s.cfg
	if !p.bound() {
		s.log.Warn("browser login disabled: --oidc-issuer-url and --oidc-issuer-client-id are not set; /authorize answers 503 until it is configured",
			"reason", "--oidc-issuer-url and --oidc-issuer-client-id are not set")
		return login{}, nil
	}
	rc, err := s.provider()
	if err != nil {
		return login{}, err
	}
	tokens, revoked, err := s.newCLITokens(rc)
	if err != nil {
		return login{}, err
	}
	a, err := oidc.New(oidc.Config{
		IssuerURL:           cfg.OIDC.IssuerURL,
		ClientID:            cfg.OIDC.ClientID,
		ClientSecret:        cfg.OIDC.ClientSecret,
		RedirectURL:         cfg.callbackURL(s.ext),
		SigningKey:          currentKey(cfg.Browser.SigningKeys),
		PreviousSigningKeys: previousKeys(cfg.Browser.SigningKeys),
		SecureCookies:       s.ext.Scheme == "https",
		AllowedUsers:        cfg.OIDC.AllowedUsers,
		AllowedGroups:       cfg.OIDC.AllowedGroups,
		// The login may take as long as the session it belongs to.
		StateTTL:       cfg.SessionTTL,
		UseOnce:        lifecycle.LoginStates(s.store, cfg.SessionTTL, s.now),
		HealthInterval: dependencyInterval,
		Logger:         s.log.With("component", "oidc"),
	})
	if err != nil {
		return login{}, err
	}
	s.loops = append(s.loops, loop{"oidc discovery", a.Run})
	// Ready once the exported APIs are cached: what this replica needs to
	// serve the browser part. Neither the identity provider nor the
	// provider cluster decides it: every replica shares them, and taking
	// all replicas out of their Service during an outage would stop the
	// polls of finished binds too.
	cached := health.CheckFunc("exported-apis", func(context.Context) error {
		if !p.catalog.HasSynced() {
			return errors.New("the exported APIs are not cached yet")
		}
		return nil
	})
	readiness := []health.Check{cached}
	if revoked != nil {
		// A token cannot be judged before its user's revocations are read.
		readiness = append(readiness, health.CheckFunc("cli-token-revocations", func(context.Context) error {
			if !revoked.HasSynced() {
				return errors.New("the CLI token revocations are not read yet")
			}
			return nil
		}))
	}
	return login{oidc: a, tokens: tokens, readiness: readiness, dependencies: []health.Check{a, p.catalog}}, nil
}

// newSessionService builds the one session service every handler shares:
// it binds on the provider side (when there is one) and marks deliveries
// through its provisioner.
func (s *Server) newSessionService(p providerSide) (*lifecycle.Service, error) {
	cfg := lifecycle.Config{Store: s.store, Keys: s.keys, ClusterKey: s.clusterKey, Now: s.now,
		SessionTTL: s.cfg.SessionTTL, Grace: s.cfg.GracePeriod}
	if p.bound() {
		// Interfaces holding nil pointers would not be nil.
		cfg.Catalog, cfg.Provisioner, cfg.Offers = p.catalog, p.provisioner, p.offers
	}
	return lifecycle.New(cfg)
}

// newParts builds the parts of the HTTP API over the session service:
// each protocol generation and the browser login (or, without an
// identity provider, the browser part that says it is not configured).
func (s *Server) newParts(l login, reg prometheus.Registerer) ([]mount.Part, error) {
	cfg := s.cfg
	pollSessions, err := pollsession.New(s.sessions, reg)
	if err != nil {
		return nil, err
	}
	v1, err := apiv1alpha1.New(apiv1alpha1.Config{
		ExternalURL:     s.ext,
		PrettyName:      cfg.PrettyName,
		PollInterval:    cfg.PollInterval,
		LongPollMaxWait: s.longPoll.MaxWait(),
		NoCallbackFlow:  cfg.Browser.NoCallbackFlow,
		Sessions:        pollSessions,
	})
	if err != nil {
		return nil, err
	}
	if p := s.ext.EscapedPath(); p != "" && p != "/" {
		s.log.Warn("the external URL has a path prefix, but released kubectl-bind v0.6+ CLIs call /, /exports and /api/ at the host root: route those to the backend too",
			"external_url", s.ext.String())
	}
	v2cfg := apiv1alpha2.Config{
		ExternalURL:     s.ext,
		PrettyName:      cfg.PrettyName,
		Sessions:        s.sessions,
		PollSessions:    pollSessions,
		Issuer:          cfg.OIDC.IssuerURL,
		Allows:          cliUserAllowed(cfg.OIDC.AllowList()),
		PollInterval:    cfg.PollInterval,
		LongPollMaxWait: s.longPoll.MaxWait(),
		NoCallbackFlow:  cfg.Browser.NoCallbackFlow,
		RequestRate:     cfg.CLITokens.RequestRate,
		BindRate:        cfg.CLITokens.BindRate,
		Logger:          s.log.With("component", "v1alpha2"),
	}
	kbv2cfg := kbindv2.Config{
		ExternalURL: s.ext,
		PrettyName:  cfg.PrettyName,
		Sessions:    s.sessions,
		Logger:      s.log.With("component", "kbindv2"),
	}
	var browserPart mount.Part = browser.Unconfigured{}
	if l.oidc != nil {
		b, err := browser.New(browser.Config{
			ExternalURL:       s.ext,
			ProviderName:      cfg.PrettyName,
			Sessions:          s.sessions,
			Login:             l.oidc,
			CookieHashKeys:    cfg.Browser.SigningKeys,
			CookieBlockKeys:   cfg.Browser.EncryptionKeys,
			CallbackAllowList: cfg.Browser.CallbackAllowList,
			NoCallbackFlow:    cfg.Browser.NoCallbackFlow,
			Logger:            s.log.With("component", "browser"),
			Tokens:            l.tokens,
		})
		if err != nil {
			return nil, err
		}
		browserPart = b
		// A nil *browser.Handler in the interface would not be nil.
		v2cfg.Browser, v2cfg.Tokens = b, l.tokens
		kbv2cfg.Browser = b
	}
	v2, err := apiv1alpha2.New(v2cfg)
	if err != nil {
		return nil, err
	}
	kbv2, err := kbindv2.New(kbv2cfg)
	if err != nil {
		return nil, err
	}
	return []mount.Part{v1, browserPart, v2, kbv2}, nil
}

// currentKey and previousKeys split a key list, the current key first,
// into the current key and the previous ones (nil, nil for none).
func currentKey(keys [][]byte) []byte {
	if len(keys) == 0 {
		return nil
	}
	return keys[0]
}

func previousKeys(keys [][]byte) [][]byte {
	if len(keys) < 2 {
		return nil
	}
	return keys[1:]
}
