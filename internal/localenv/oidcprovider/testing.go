package oidcprovider

import (
	"context"
	"time"

	"github.com/kbprovider/backend/internal/testutil/tb"
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
func Start(t tb.TB, opts Options) *Provider {
	t.Helper()
	var (
		p   *Provider
		err error
	)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		p, err = Run(ctx, opts)
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

// The tests' users: Alice is in group "binders", which the tests'
// backends allow to bind (--oidc-allowed-groups=binders); Mallory is not.
var (
	Alice   = User{Name: "alice", Password: "alice-pw", Email: "alice@example.com", Groups: []string{"binders"}}
	Mallory = User{Name: "mallory", Password: "mallory-pw", Email: "mallory@example.com", Groups: []string{"visitors"}}
)
