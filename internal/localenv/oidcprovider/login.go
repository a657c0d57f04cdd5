package oidcprovider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"

	"github.com/kbprovider/backend/internal/testutil"

	"golang.org/x/net/html"
)

// ErrLoginRefused is returned when the provider refuses the user name or password.
var ErrLoginRefused = errors.New("oidcprovider: login refused")

const (
	maxSteps     = 20
	maxPageBytes = 1 << 20
)

// Login signs user in the way a browser would: it GETs authURL (the
// provider's authorization URL, or a URL of the backend that redirects
// there), follows redirects keeping cookies, fills and submits the login
// form, confirms the consent form, and returns the final redirect to one of
// the client's redirect URIs (carrying code and state, or an error) without
// following it. The client's cookie jar is used when it has one, so cookies
// the backend set on the way stay with the caller. Like a browser, a jar
// that already holds a session at the provider skips the login form (and
// then user and password are not checked): use a fresh jar per user.
func (p *Provider) Login(ctx context.Context, client *http.Client, authURL, user, password string) (*url.URL, error) {
	return p.login(ctx, client, authURL, user, password, true)
}

// LoginAndDeny signs user in like Login but then denies consent, as a user
// who clicks "Deny" would; the returned redirect carries error=access_denied.
func (p *Provider) LoginAndDeny(ctx context.Context, client *http.Client, authURL, user, password string) (*url.URL, error) {
	return p.login(ctx, client, authURL, user, password, false)
}

func (p *Provider) login(ctx context.Context, client *http.Client, authURL, user, password string, consent bool) (*url.URL, error) {
	if client == nil {
		client = &http.Client{}
	}
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if c.Jar == nil {
		jar, err := cookiejar.New(nil)
		if err != nil {
			return nil, err
		}
		c.Jar = jar
	}

	method, target, form := http.MethodGet, authURL, url.Values(nil)
	loginSubmitted := false
	for step := 0; step < maxSteps; step++ {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, target, body)
		if err != nil {
			return nil, err
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		page, err := io.ReadAll(io.LimitReader(resp.Body, maxPageBytes))
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, target, err)
		}

		if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
			next, err := req.URL.Parse(loc)
			if err != nil {
				return nil, fmt.Errorf("%s %s: bad Location %q: %w", method, target, loc, err)
			}
			if p.isRedirectURI(next) {
				return next, nil
			}
			method, target, form = http.MethodGet, next.String(), nil
			continue
		}

		doc, err := html.Parse(strings.NewReader(string(page)))
		if err != nil {
			return nil, fmt.Errorf("%s %s: %s: %w", method, target, resp.Status, err)
		}
		forms, err := testutil.ParseForms(page)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %s: %w", method, target, resp.Status, err)
		}
		if f, ok := formWithInput(forms, "password"); ok {
			if loginSubmitted {
				return nil, fmt.Errorf("%w: %s", ErrLoginRefused, strings.TrimSpace(textOf(findByID(doc, "login-error"))))
			}
			loginSubmitted = true
			f.Fields.Set("login", user)
			f.Fields.Set("password", password)
			method, form = http.MethodPost, f.Fields
			if target, err = resolve(req.URL, f.Action); err != nil {
				return nil, err
			}
			continue
		}
		suffix := "/confirm"
		if !consent {
			suffix = "/abort"
		}
		if f, ok := formWithActionSuffix(forms, suffix); ok {
			method, form = http.MethodPost, f.Fields
			if target, err = resolve(req.URL, f.Action); err != nil {
				return nil, err
			}
			continue
		}
		return nil, fmt.Errorf("%s %s: unexpected page (%s): %.300s", method, target, resp.Status, page)
	}
	return nil, fmt.Errorf("no redirect to the client after %d steps", maxSteps)
}

func (p *Provider) isRedirectURI(u *url.URL) bool {
	for _, r := range p.redirectURIs {
		ru, err := url.Parse(r)
		if err == nil && strings.EqualFold(ru.Scheme, u.Scheme) && strings.EqualFold(ru.Host, u.Host) && ru.Path == u.Path {
			return true
		}
	}
	return false
}

func resolve(base *url.URL, action string) (string, error) {
	u, err := base.Parse(action)
	if err != nil {
		return "", fmt.Errorf("bad form action %q: %w", action, err)
	}
	return u.String(), nil
}

func formWithInput(forms []testutil.Form, name string) (testutil.Form, bool) {
	for _, f := range forms {
		if f.Fields.Has(name) {
			return f, true
		}
	}
	return testutil.Form{}, false
}

func formWithActionSuffix(forms []testutil.Form, suffix string) (testutil.Form, bool) {
	for _, f := range forms {
		if strings.HasSuffix(f.Action, suffix) {
			return f, true
		}
	}
	return testutil.Form{}, false
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func findByID(n *html.Node, id string) *html.Node {
	if n.Type == html.ElementNode && attr(n, "id") == id {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := findByID(c, id); f != nil {
			return f
		}
	}
	return nil
}

func textOf(n *html.Node) string {
	if n == nil {
		return ""
	}
	if n.Type == html.TextNode {
		return n.Data
	}
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		b.WriteString(textOf(c))
	}
	return b.String()
}
