package e2e

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/pollclient"
)

// The refusals of the browser part: each gets the right page and status,
// and nothing is provisioned for the user.
func TestRefusals(t *testing.T) {
	e := startEnv(t, backendOptions{})

	t.Run("tampered signature", func(t *testing.T) {
		s, authURL := e.newSession(t)
		u, _ := url.Parse(authURL)
		q := u.Query()
		h := []byte(q.Get("h"))
		h[0] ^= 1
		q.Set("h", string(h))
		u.RawQuery = q.Encode()
		status, body := e.get(t, newJarClient(t), u.String())
		expectPage(t, status, body, http.StatusUnauthorized, "not valid")
		e.expectStillPending(t, s)
	})

	t.Run("reused nonce", func(t *testing.T) {
		// Opening a link spends nothing; the first sign-in through it
		// does, and the next sign-in through it is refused.
		_, authURL := e.newSession(t)
		if status, body := e.get(t, newJarClient(t), authURL); status != http.StatusOK {
			t.Fatalf("first opening: %d %s", status, body)
		}
		e.loginToSelection(t, authURL, dave)
		client := newJarClient(t)
		callback, err := e.idp.Login(context.Background(), client, authURL, dave.Name, dave.Password)
		if err != nil {
			t.Fatal(err)
		}
		status, body := e.get(t, client, callback.String())
		expectPage(t, status, body, http.StatusUnauthorized, "already used")
	})

	t.Run("unknown session", func(t *testing.T) {
		_, authURL := e.newSession(t)
		u, _ := url.Parse(authURL)
		q := u.Query()
		q.Set("s", "AAAAAAAAAAAAAAAAAAAAAA")
		u.RawQuery = q.Encode()
		status, body := e.get(t, newJarClient(t), u.String())
		expectPage(t, status, body, http.StatusNotFound, "not known")
	})

	t.Run("forged and replayed OAuth state", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client := newJarClient(t)
		callback, err := e.idp.Login(context.Background(), client, authURL, carol.Name, carol.Password)
		if err != nil {
			t.Fatal(err)
		}
		forged := *callback
		q := forged.Query()
		q.Set("state", q.Get("state")+"x")
		forged.RawQuery = q.Encode()
		status, body := e.get(t, client, forged.String())
		expectPage(t, status, body, http.StatusBadRequest, "cannot be finished")

		// The genuine callback works once, and a replay of it is refused.
		if status, body := e.get(t, client, callback.String()); status != http.StatusOK || !strings.Contains(body, "Choose APIs") {
			t.Fatalf("genuine callback: %d %s", status, body)
		}
		status, body = e.get(t, client, callback.String())
		expectPage(t, status, body, http.StatusBadRequest, "cannot be finished")
		e.expectStillPending(t, s)
		e.expectNothingProvisioned(t, carol)
	})

	t.Run("bind without the CSRF token", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client, form := e.loginToSelection(t, authURL, dave)
		form.Set("csrf_token", "guessed")
		status, body := e.post(t, client, form, nil)
		expectPage(t, status, body, http.StatusForbidden, "did not come from")
		form = e.selectionForm(t, client, s.ID)
		status, body = e.post(t, client, form, http.Header{"Sec-Fetch-Site": {"cross-site"}})
		expectPage(t, status, body, http.StatusForbidden, "did not come from")
		status, body = e.post(t, client, form, http.Header{"Origin": {"http://evil.example.com"}})
		expectPage(t, status, body, http.StatusForbidden, "did not come from")
		e.expectStillPending(t, s)
		e.expectNothingProvisioned(t, dave)
	})

	t.Run("API that is not exported", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client, form := e.loginToSelection(t, authURL, dave)
		form["api"] = []string{"mangodbs.mangodb.com", "secretthings.internal.example.com"}
		status, body := e.post(t, client, form, nil)
		if status != http.StatusUnprocessableEntity || !strings.Contains(body, "not offered") {
			t.Fatalf("got %d, want 422 with the selection page again saying the API is not offered:\n%s", status, body)
		}
		e.expectStillPending(t, s)
		e.expectNothingProvisioned(t, dave)
	})

	t.Run("bind without the confirmation", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client, form := e.loginToSelection(t, authURL, dave)
		form.Del("confirm")
		status, body := e.post(t, client, form, nil)
		if status != http.StatusUnprocessableEntity || !strings.Contains(body, "Confirm that you started this binding yourself") {
			t.Fatalf("got %d, want 422 with the selection page again asking for the confirmation:\n%s", status, body)
		}
		form.Set("confirm", "on")
		status, body = e.post(t, client, form, nil)
		if status != http.StatusUnprocessableEntity || !strings.Contains(body, "Confirm that you started") {
			t.Fatalf("confirm=on: got %d, want 422 with the selection page again:\n%s", status, body)
		}
		e.expectStillPending(t, s)
		e.expectNothingProvisioned(t, dave)
	})

	t.Run("cancel", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client, form := e.loginToSelection(t, authURL, dave)
		form.Set("action", "cancel")
		status, body := e.post(t, client, form, nil)
		expectPage(t, status, body, http.StatusOK, "cancelled")
		e.expectDenied(t, s, "cancelled")
		e.expectNothingProvisioned(t, dave)
	})

	t.Run("user outside the allow-list", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client := newJarClient(t)
		callback, err := e.idp.Login(context.Background(), client, authURL, mallory.Name, mallory.Password)
		if err != nil {
			t.Fatal(err)
		}
		status, body := e.get(t, client, callback.String())
		expectPage(t, status, body, http.StatusForbidden, "Access denied")
		e.expectDenied(t, s, "may not bind")
		e.expectNothingProvisioned(t, mallory)
	})

	t.Run("user declines at the identity provider", func(t *testing.T) {
		s, authURL := e.newSession(t)
		client := newJarClient(t)
		callback, err := e.idp.LoginAndDeny(context.Background(), client, authURL, dave.Name, dave.Password)
		if err != nil {
			t.Fatal(err)
		}
		// Nobody signed in: nothing is recorded, the session stays
		// pending and its link still works.
		status, body := e.get(t, client, callback.String())
		expectPage(t, status, body, http.StatusForbidden, "open the link from your terminal again")
		e.expectStillPending(t, s)
		e.loginToSelection(t, authURL, dave)
	})

	t.Run("callback URL off this computer", func(t *testing.T) {
		for _, u := range []string{"https://evil.example.com/callback", "http://evil.example.com/callback", "http://127.0.0.1.evil.example.com/callback", "javascript:alert(1)", "//evil.example.com/x"} {
			link := e.baseURL + "/authorize?" + url.Values{"u": {u}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
			status, body := e.get(t, newJarClient(t), link)
			expectPage(t, status, body, http.StatusBadRequest, "cannot be used")
		}
	})

	t.Run("cross-site form in a real browser", func(t *testing.T) {
		s, authURL := e.newSession(t)
		b := chromium.New(t)
		b.Open(authURL)
		chromium.SignIn(t, b, dave)
		if !strings.HasPrefix(b.URL(), e.baseURL+"/bind") {
			t.Fatalf("not on the selection page: %s", b.URL())
		}
		// Another site (localhost is not the same site as 127.0.0.1) posts
		// a bind form into the logged-in browser.
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/bind">
<input type="hidden" name="s" value="%s"><input type="hidden" name="csrf_token" value="guess">
<input type="hidden" name="api" value="mangodbs.mangodb.com"><input type="hidden" name="action" value="bind">
<button id="go" type="submit">win a prize</button></form>`, e.baseURL, html.EscapeString(s.ID))
		}))
		defer evil.Close()
		b.Open(strings.Replace(evil.URL, "127.0.0.1", "localhost", 1))
		if status := b.ClickAndWait("#go"); status != http.StatusForbidden && status != http.StatusUnauthorized {
			t.Errorf("cross-site bind answered %d: %s", status, b.Text("body"))
		}
		e.expectStillPending(t, s)
		e.expectNothingProvisioned(t, dave)
	})
}

func TestExpiredSession(t *testing.T) {
	e := startEnv(t, backendOptions{extraArgs: []string{"--session-ttl", "3s", "--poll-interval", "1s"}})
	s, authURL := e.newSession(t)
	time.Sleep(3500 * time.Millisecond)
	status, body := e.get(t, newJarClient(t), authURL)
	expectPage(t, status, body, http.StatusGone, "expired")
	_, err := s.Wait(context.Background())
	if !errors.Is(err, pollclient.ErrExpired) {
		t.Errorf("poll after expiry: %v, want ErrExpired", err)
	}
}

// newSession creates a poll session and its signed authentication URL.
func (e *env) newSession(t *testing.T) (*pollclient.Session, string) {
	t.Helper()
	ctx := context.Background()
	c := pollclient.New(nil)
	p, err := c.Discover(ctx, e.baseURL+"/export")
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(ctx, p, "")
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.AuthenticationURL()
	if err != nil {
		t.Fatal(err)
	}
	return s, u
}

func newJarClient(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 30 * time.Second}
}

func (e *env) get(t *testing.T, client *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (e *env) post(t *testing.T, client *http.Client, form url.Values, header http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.baseURL+"/bind", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// loginToSelection logs user in through authURL without a browser and
// returns the client (with the backend's cookies) and the selection form
// as the page would post it, one API ticked.
func (e *env) loginToSelection(t *testing.T, authURL string, user oidcprovider.User) (*http.Client, url.Values) {
	t.Helper()
	client := newJarClient(t)
	callback, err := e.idp.Login(context.Background(), client, authURL, user.Name, user.Password)
	if err != nil {
		t.Fatal(err)
	}
	status, body := e.get(t, client, callback.String())
	if status != http.StatusOK {
		t.Fatalf("login callback: %d %s", status, body)
	}
	return client, formFromPage(t, body)
}

// selectionForm fetches the selection page again and returns its form.
func (e *env) selectionForm(t *testing.T, client *http.Client, sid string) url.Values {
	t.Helper()
	status, body := e.get(t, client, e.baseURL+"/bind?s="+url.QueryEscape(sid))
	if status != http.StatusOK {
		t.Fatalf("selection page: %d %s", status, body)
	}
	return formFromPage(t, body)
}

func formFromPage(t *testing.T, page string) url.Values {
	t.Helper()
	form := testutil.FormOn(t, []byte(page), http.MethodPost).Fields
	if form.Get("csrf_token") == "" || form.Get("s") == "" {
		t.Fatalf("selection page has no CSRF token or session field:\n%s", page)
	}
	form.Set("api", "mangodbs.mangodb.com")
	form.Set("action", "bind")
	form.Set("confirm", "yes")
	return form
}

func expectPage(t *testing.T, status int, body string, wantStatus int, wantText string) {
	t.Helper()
	if status != wantStatus || !strings.Contains(body, wantText) {
		t.Errorf("got %d, want %d with %q in the page:\n%s", status, wantStatus, wantText, body)
	}
}

// expectStillPending polls once (after the interval) and wants 403 pending.
func (e *env) expectStillPending(t *testing.T, s *pollclient.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := s.Wait(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("session should still be pending, poll ended with %v", err)
	}
}

func (e *env) expectDenied(t *testing.T, s *pollclient.Session, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.Wait(ctx)
	if !errors.Is(err, pollclient.ErrAccessDenied) || !strings.Contains(err.Error(), reason) {
		t.Errorf("poll ended with %v, want access denied saying %q", err, reason)
	}
}

func (e *env) expectNothingProvisioned(t *testing.T, user oidcprovider.User) {
	t.Helper()
	if ns := e.consumerNamespaces(t, user); len(ns) != 0 {
		t.Errorf("namespaces provisioned for %s: %v", user.Name, ns)
	}
}
