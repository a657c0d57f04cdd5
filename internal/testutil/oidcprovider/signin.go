package oidcprovider

import (
	"testing"

	"github.com/kbprovider/backend/internal/testutil/chromium"
)

// SignIn signs user in on the provider's login page that b shows, and
// confirms the consent page when the provider asks for one (the first
// login of a user at a client).
func SignIn(t testing.TB, b *chromium.Browser, user User) {
	t.Helper()
	b.Fill("#login", user.Name)
	b.Fill("#password", user.Password)
	b.Submit("button[type=submit]")
	if b.Exists("form[action$='/confirm'] button") {
		b.ClickAndWait("form[action$='/confirm'] button")
	}
}
