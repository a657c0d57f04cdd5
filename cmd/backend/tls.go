package main

import (
	"context"
	"crypto/tls"
	"log/slog"

	"github.com/kbprovider/backend/internal/servingcert"
)

// servingTLS returns the TLS configuration of the public listener, nil
// without --tls-cert-file. The certificate is re-read when the files
// change (cert-manager and the kubelet rotate mounted Secrets) until ctx
// ends: new handshakes get the new pair, open connections stay.
func servingTLS(ctx context.Context, cfg *config, logger *slog.Logger) (*tls.Config, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil
	}
	r, err := servingcert.New(cfg.TLSCertFile, cfg.TLSKeyFile, logger.With("component", "servingcert"))
	if err != nil {
		return nil, err
	}
	go r.Run(ctx)
	return r.TLSConfig(), nil
}
