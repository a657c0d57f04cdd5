package chromium

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
)

// What the tests do in the browser: sign in at the test identity provider
// (internal/localenv/oidcprovider), and the browser parts of the released
// kubectl-bind.

// SignIn signs user in on the provider's login page that b shows, and
// confirms the consent page when the provider asks for one (the first
// login of a user at a client).
func SignIn(t testing.TB, b *Browser, user oidcprovider.User) {
	t.Helper()
	signIn(b, user, b.ClickAndWait)
}

// SignInToCLI signs user in like SignIn where the login ends at a CLI's
// localhost callback server, which may close as soon as it has its answer
// (kubectl-bind does when it is refused): the consent is clicked without
// waiting for that last page to load. The CLI's exit tells the outcome.
func SignInToCLI(t testing.TB, b *Browser, user oidcprovider.User) {
	t.Helper()
	signIn(b, user, func(selector string) int { b.Click(selector); return 0 })
}

func signIn(b *Browser, user oidcprovider.User, confirm func(selector string) int) {
	b.t.Helper()
	b.Fill("#login", user.Name)
	b.Fill("#password", user.Password)
	b.Submit("button[type=submit]")
	if b.Exists("form[action$='/confirm'] button") {
		confirm("form[action$='/confirm'] button")
	}
}

// LoginCLI runs `kubectl-bind login server --skip-browser` from home and
// signs user in with chromium at the URL it prints; the CLI must exit 0
// having authenticated (its token then is in konnector.CLIConfigFile(home)).
// The last page is the CLI's callback server, which also closes as soon
// as it has its token: the browser may get an empty response there, so
// the sign-in does not wait for that page (SignInToCLI).
func LoginCLI(t testing.TB, release, home, server string, user oidcprovider.User) {
	t.Helper()
	c := konnector.RunCLI(t, release, home, "login", server, "--skip-browser")
	u := c.URL(t)
	b := New(t)
	if status := b.Open(u); status != http.StatusOK {
		t.Fatalf("the login URL led to status %d at %s", status, b.URL())
	}
	SignInToCLI(t, b, user)
	if code := c.Wait(t, time.Minute); code != 0 {
		t.Fatalf("kubectl-bind login: exit %d; browser at %s:\n%s", code, b.URL(), b.Text("body"))
	}
	if !strings.Contains(c.Stderr.String(), "Successfully authenticated") {
		t.Fatalf("kubectl-bind login did not say it authenticated:\n%s", c.Stderr.String())
	}
}

// OpenBindPage opens u (a link a CLI prints) in a new chromium, signs
// user in and expects to be back on the backend, at a URL that starts
// with back (its URL, or its selection page's). PressBind goes on from
// there.
func OpenBindPage(t testing.TB, u, back string, user oidcprovider.User) *Browser {
	t.Helper()
	b := New(t)
	if status := b.Open(u); status != http.StatusOK {
		t.Fatalf("the URL led to status %d at %s", status, b.URL())
	}
	SignIn(t, b, user)
	if !strings.HasPrefix(b.URL(), back) {
		t.Fatalf("after login the browser is at %s:\n%s", b.URL(), b.Text("body"))
	}
	return b
}

// PressBind picks apis on the selection page b shows, confirms the
// callback address if asked, and presses Bind.
func PressBind(t testing.TB, b *Browser, apis ...string) {
	t.Helper()
	for _, a := range apis {
		b.Click("input[value='" + a + "']")
	}
	if b.Exists("#confirm") {
		b.Click("#confirm")
	}
	b.ClickAndWait("button[value=bind]")
}
