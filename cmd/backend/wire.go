package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/clusterkey"
	"github.com/kbprovider/backend/internal/health"
	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/sessions"
)

// wiring is what run has built before the components.
type wiring struct {
	logger    *slog.Logger
	ext       *url.URL
	store     sessions.Store
	metrics   *prometheus.Registry
	readiness []health.Check
	// clusterKey is shared by the session endpoint and the browser part.
	clusterKey *clusterkey.Key
}

// newHandler assembles the backend's components into its HTTP handler.
// Components that talk to dependencies (identity provider, provider
// cluster) must start in the background, retrying, and report through a
// readiness check: the backend serves discovery and polls while they are
// down, and never exits because of them. ctx ends at shutdown.
//
// The browser login (internal/oidc, web/) and the provider cluster side
// (internal/binding) are wired in here: the former as httpapi.Config.Browser,
// both with their readiness checks appended to w.readiness.
func newHandler(ctx context.Context, cfg *config, w wiring) (http.Handler, error) {
	key, err := clusterkey.New(cfg.ClusterSecretKey)
	if err != nil {
		return nil, err
	}
	w.clusterKey = key
	browserHandler, checks, disabled, onDelivered, err := newBrowser(ctx, cfg, w)
	if err != nil {
		return nil, err
	}
	if disabled != "" {
		w.logger.Warn("browser login disabled: "+disabled+"; /authorize answers 503 until it is configured", "reason", disabled)
	}
	return httpapi.New(httpapi.Config{
		ExternalURL:  w.ext,
		PrettyName:   cfg.PrettyName,
		PollInterval: cfg.PollInterval,
		SessionTTL:   cfg.SessionTTL,
		Store:        w.store,
		Logger:       w.logger,
		Metrics:      w.metrics,
		Readiness:    append(w.readiness, checks...),
		Browser:      browserHandler,
		OnDelivered:  onDelivered,
		ClusterKey:   key,
	})
}
