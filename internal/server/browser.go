package server

import (
	"context"
	"errors"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/server/health"
)

// browserPart is the browser login and the provider cluster side behind
// it, as the public handler needs them.
type browserPart struct {
	handler *browser.Handler
	// readiness: this replica's own caches; dependencies: what every
	// replica shares (the identity provider, the provider cluster).
	readiness, dependencies []health.Check
	// offers and tokens serve the v1alpha2 routes (server.newV1alpha2).
	offers *offers.Source
	tokens *clitoken.Tokens
	// catalog and provisioner are what the provider-side controllers
	// work with (server.newControllers).
	catalog     *binding.Catalog
	provisioner *binding.Provisioner
}

// newBrowser builds the browser part: the login at the identity provider,
// the catalog and provisioner on the provider cluster (which also marks
// deliveries, for the session service) and the browser handler. Without an identity provider
// configured it builds none of them: discovery, sessions and polls still
// work, and /authorize answers 503.
func (s *Server) newBrowser(ctx context.Context) (browserPart, error) {
	cfg := s.cfg
	if !cfg.OIDC.Enabled() {
		s.log.Warn("browser login disabled: --oidc-issuer-url and --oidc-issuer-client-id are not set; /authorize answers 503 until it is configured",
			"reason", "--oidc-issuer-url and --oidc-issuer-client-id are not set")
		return browserPart{}, nil
	}
	rc, err := s.provider()
	if err != nil {
		return browserPart{}, err
	}
	if err := s.checkScopeAtStart(ctx, rc); err != nil {
		return browserPart{}, err
	}
	catalog, err := binding.NewCatalog(rc, cfg.Provider.ConsumerScope, binding.WithLogger(s.log.With("component", "catalog")))
	if err != nil {
		return browserPart{}, err
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
		return browserPart{}, err
	}
	// What v1alpha2 consumers may pick: the catalog's CRDs and the
	// provider's templates and collections.
	src, err := offers.New(rc, catalog, offers.Config{Logger: s.log.With("component", "offers")})
	if err != nil {
		return browserPart{}, err
	}
	tokens, revoked, err := s.newCLITokens(rc)
	if err != nil {
		return browserPart{}, err
	}
	if s.sessions, err = s.newSessionService(catalog, provisioner, src); err != nil {
		return browserPart{}, err
	}
	login, err := oidc.New(oidc.Config{
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
		UseOnce:        browser.StateOnce(s.sessions),
		HealthInterval: dependencyInterval,
		Logger:         s.log.With("component", "oidc"),
	})
	if err != nil {
		return browserPart{}, err
	}
	handler, err := browser.New(browser.Config{
		ExternalURL:       s.ext,
		ProviderName:      cfg.PrettyName,
		Sessions:          s.sessions,
		Login:             login,
		Catalog:           catalog,
		Provisioner:       provisioner,
		CookieHashKeys:    cfg.Browser.SigningKeys,
		CookieBlockKeys:   cfg.Browser.EncryptionKeys,
		CallbackAllowList: cfg.Browser.CallbackAllowList,
		NoCallbackFlow:    cfg.Browser.NoCallbackFlow,
		Logger:            s.log.With("component", "browser"),
		Offers:            src,
		Tokens:            tokens,
	})
	if err != nil {
		return browserPart{}, err
	}
	s.loops = append(s.loops,
		loop{"catalog", catalog.Run},
		loop{"offers", src.Run},
		loop{"oidc discovery", login.Run})
	// Ready once the exported APIs are cached: what this replica needs to
	// serve the browser part. Neither the identity provider nor the
	// provider cluster decides it: every replica shares them, and taking
	// all replicas out of their Service during an outage would stop the
	// polls of finished binds too.
	cached := health.CheckFunc("exported-apis", func(context.Context) error {
		if !catalog.HasSynced() {
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
	return browserPart{handler: handler, readiness: readiness, dependencies: []health.Check{login, catalog},
		offers: src, tokens: tokens, catalog: catalog, provisioner: provisioner}, nil
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
