package oidc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestOptions(t *testing.T) {
	if o, err := flagvalue.ParseNew[Options](); err != nil || o.Enabled() || !o.AllowList().Open() {
		t.Errorf("no flags: %+v %v, want the login off and open", o, err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := flagvalue.ParseNew[Options]("--oidc-issuer-url=https://idp.example.com", "--oidc-issuer-client-id=backend",
		"--oidc-issuer-client-secret-file="+secret, "--oidc-allowed-users= alice, ,bob@example.com", "--oidc-allowed-groups=admins")
	if err != nil || !o.Enabled() || o.ClientSecret != "s3cret" || !slices.Equal(o.AllowedUsers, []string{"alice", "bob@example.com"}) ||
		!slices.Equal(o.AllowList().Groups, []string{"admins"}) {
		t.Errorf("%+v %v", o, err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--oidc-issuer-url", "https://idp"}, "--oidc-issuer-client-id is required"},
		{[]string{"--oidc-issuer-url", "https://idp", "--oidc-issuer-client-id", "x"}, "--oidc-issuer-client-secret or"},
		{[]string{"--oidc-issuer-url", "idp.example.com", "--oidc-issuer-client-id", "x", "--oidc-issuer-client-secret", "s"}, "--oidc-issuer-url"},
		{[]string{"--oidc-issuer-client-secret", "a", "--oidc-issuer-client-secret-file", "/x"}, "give only one"},
		{[]string{"--oidc-issuer-client-secret-file", filepath.Join(t.TempDir(), "missing")}, "--oidc-issuer-client-secret-file"},
		{[]string{"--oidc-callback-url", "https://u:p@bind.example.com/cb"}, "--oidc-callback-url"},
	} {
		if _, err := flagvalue.ParseNew[Options](c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
