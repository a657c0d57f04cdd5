package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/health"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/oidc"
)

// newBrowser builds the browser part: the login at the identity provider
// and the provider cluster side behind the selection page. Both start in
// the background and retry; their readiness checks say when they are not
// there yet. A nil handler (with a reason) means the browser part is not
// configured: discovery, sessions and polls still work.
func newBrowser(ctx context.Context, cfg *config, w wiring) (http.Handler, []health.Check, string, func([]byte), error) {
	if cfg.OIDCIssuerURL == "" || cfg.OIDCClientID == "" {
		return nil, nil, "--oidc-issuer-url and --oidc-issuer-client-id are not set", nil, nil
	}
	rc, err := binding.RESTConfig(cfg.Kubeconfig, cfg.Context)
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("provider cluster: %w", err)
	}
	scope, err := binding.ParseScope(cfg.ConsumerScope)
	if err != nil {
		return nil, nil, "", nil, err
	}
	catalog, err := binding.NewCatalog(rc, scope, binding.WithLogger(w.logger.With("component", "catalog")))
	if err != nil {
		return nil, nil, "", nil, err
	}
	provisioner, err := binding.NewProvisioner(rc, catalog, binding.Config{
		NamespacePrefix:    cfg.NamespacePrefix,
		ProviderPrettyName: cfg.PrettyName,
		ExternalAddress:    cfg.ExternalAddress,
		ExternalCAFile:     cfg.ExternalCAFile,
		ExternalServerName: cfg.ExternalServerName,
		TokenLifetime:      cfg.Credentials.Lifetime,
	})
	if err != nil {
		return nil, nil, "", nil, err
	}

	callbackURL := cfg.OIDCCallbackURL
	if callbackURL == "" {
		callbackURL = w.ext.JoinPath("callback").String()
	}
	login, err := oidc.New(oidc.Config{
		IssuerURL:     cfg.OIDCIssuerURL,
		ClientID:      cfg.OIDCClientID,
		ClientSecret:  cfg.OIDCClientSecret,
		RedirectURL:   callbackURL,
		SigningKey:    cfg.CookieSigningKey,
		SecureCookies: w.ext.Scheme == "https",
		AllowedUsers:  cfg.OIDCAllowedUsers,
		AllowedGroups: cfg.OIDCAllowedGroups,
		// States are single-use across replicas: the session store
		// remembers them like nonces of the session they belong to.
		UseOnce: func(ctx context.Context, flowState []byte, key string) error {
			return w.store.UseNonce(ctx, browser.FlowSessionID(flowState), "oidc-state:"+key)
		},
		Logger: w.logger.With("component", "oidc"),
	})
	if err != nil {
		return nil, nil, "", nil, err
	}

	// Records on the ClusterBinding that a response was handed out, for
	// the garbage collection of never-delivered bindings.
	marker := binding.NewDeliveryMarker(provisioner, w.logger.With("component", "delivery"))
	handler, err := browser.New(browser.Config{
		ExternalURL:    w.ext,
		ProviderName:   cfg.PrettyName,
		Store:          w.store,
		SessionTTL:     cfg.SessionTTL,
		Login:          login,
		Catalog:        catalog,
		Provisioner:    provisioner,
		ClusterKey:     w.clusterKey,
		CookieHashKey:  cfg.CookieSigningKey,
		CookieBlockKey: cfg.CookieEncryptionKey,
		// The callback flow's u may also point at these prefixes.
		CallbackAllowList: cfg.CallbackAllowList,
		Logger:            w.logger.With("component", "browser"),
		OnDelivered:       marker.Delivered,
	})
	if err != nil {
		return nil, nil, "", nil, err
	}
	catalog.Start(ctx)
	if err := startControllers(ctx, cfg, rc, catalog, provisioner, w); err != nil {
		return nil, nil, "", nil, err
	}
	go login.Run(ctx)
	go marker.Run(ctx)
	return handler, []health.Check{login, catalog}, "", marker.Delivered, nil
}
