package oidcprovider

import (
	"context"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// Start starts a provider for the test and stops it when the test ends. It
// fails the test (in CI and elsewhere) when Node.js or the npm packages are
// missing, naming the script that installs them.
func Start(t tb.TB, opts Options) *Provider {
	t.Helper()
	p, err := RunRetrying(context.Background(), opts, func(attempt int, err error) {
		t.Logf("oidcprovider: start %d failed, starting it again: %v", attempt, err)
	})
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
