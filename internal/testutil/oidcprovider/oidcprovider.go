// Package oidcprovider is internal/localenv/oidcprovider for tests: a real
// OpenID Connect provider that is stopped when the test ends.
package oidcprovider

import (
	"context"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
)

type (
	// User is a test user the provider knows.
	User = oidcprovider.User
	// Options configure the provider.
	Options = oidcprovider.Options
	// Provider is a running provider.
	Provider = oidcprovider.Provider
)

// A start gets attemptTimeout, and a failed one is made again once: in
// two full CI runs out of many, Node.js printed its runtime warning and
// then nothing for 60 s ("not serving"), cause not found; the provider
// it runs is the same each time, so a second start is worth its time.
const (
	attemptTimeout = 40 * time.Second
	startAttempts  = 2
)

// Start starts a provider for the test and stops it when the test ends. It
// fails the test (in CI and elsewhere) when Node.js or the npm packages are
// missing, naming the script that installs them.
func Start(t testing.TB, opts Options) *Provider {
	t.Helper()
	var (
		p   *Provider
		err error
	)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		p, err = oidcprovider.Run(ctx, opts)
		cancel()
		if err == nil || attempt == startAttempts {
			break
		}
		t.Logf("oidcprovider: start %d failed, starting it again: %v", attempt, err)
	}
	if err != nil {
		t.Fatalf("oidcprovider: %v", err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() && p.Logs() != "" {
			t.Logf("oidcprovider logs:\n%s", p.Logs())
		}
	})
	return p
}

// Run starts a provider shared by several tests (from TestMain or a
// sync.Once); the caller must call Stop.
func Run(ctx context.Context, opts Options) (*Provider, error) { return oidcprovider.Run(ctx, opts) }
