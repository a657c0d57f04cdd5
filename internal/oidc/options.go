package oidc

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// Options are the login's flags (--oidc-*). The login is off unless
// IssuerURL and ClientID are set (Enabled).
type Options struct {
	IssuerURL string
	ClientID  string
	// ClientSecret is the secret from its flag or, after Complete, its file.
	ClientSecret string
	// CallbackURL is the redirect URL registered at the identity
	// provider; "" is <external URL>/callback.
	CallbackURL string
	// AllowedUsers and AllowedGroups (set by Complete): see Config.
	AllowedUsers, AllowedGroups []string

	clientSecretFile            string
	allowedUsers, allowedGroups string
}

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	s := fs.StringVar
	s(&o.IssuerURL, "oidc-issuer-url", "", "issuer URL of the OpenID Connect provider users log in at")
	s(&o.ClientID, "oidc-issuer-client-id", "", "OAuth2 client ID of the backend at the OpenID Connect provider")
	s(&o.ClientSecret, "oidc-issuer-client-secret", "", "OAuth2 client secret (prefer --oidc-issuer-client-secret-file)")
	s(&o.clientSecretFile, "oidc-issuer-client-secret-file", "", "file holding the OAuth2 client secret, e.g. a mounted Kubernetes Secret")
	s(&o.CallbackURL, "oidc-callback-url", "", "redirect URL registered at the OpenID Connect provider (default: <external-url>/callback)")
	s(&o.allowedUsers, "oidc-allowed-users", "", "comma-separated subjects (preferred) or e-mail addresses allowed to bind; an address matches only when the ID token says email_verified: true (default: everybody the provider accepts)")
	s(&o.allowedGroups, "oidc-allowed-groups", "", "comma-separated groups whose members may bind (default: everybody the provider accepts)")
}

// Complete reads the secret and the allow-lists and checks the flags.
func (o *Options) Complete() error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	o.AllowedUsers, o.AllowedGroups = flagvalue.List(o.allowedUsers), flagvalue.List(o.allowedGroups)
	if o.CallbackURL != "" {
		if _, err := flagvalue.HTTPURL(o.CallbackURL); err != nil {
			fail("--oidc-callback-url %q: %v", o.CallbackURL, err)
		}
	}
	secret, err := flagvalue.ValueOrFile("oidc-issuer-client-secret", o.ClientSecret, o.clientSecretFile)
	if err != nil {
		errs = append(errs, err)
	}
	o.ClientSecret = secret
	if o.IssuerURL != "" {
		if _, err := flagvalue.HTTPURL(o.IssuerURL); err != nil {
			fail("--oidc-issuer-url %q: %v", o.IssuerURL, err)
		}
		if o.ClientID == "" {
			fail("--oidc-issuer-client-id is required with --oidc-issuer-url")
		}
		if secret == "" {
			fail("--oidc-issuer-client-secret or --oidc-issuer-client-secret-file is required with --oidc-issuer-url")
		}
	}
	return errors.Join(errs...)
}

// Enabled says whether the browser login is configured.
func (o *Options) Enabled() bool { return o.IssuerURL != "" && o.ClientID != "" }

// AllowList is the allow-list the flags set.
func (o *Options) AllowList() AllowList {
	return AllowList{Users: o.AllowedUsers, Groups: o.AllowedGroups}
}
