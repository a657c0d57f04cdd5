package server

import (
	"net"
	"net/url"
	"testing"
)

// Without --external-url the backend advertises its listen address (for
// local use), and the OIDC callback follows the external URL.
func TestExternalURLDerived(t *testing.T) {
	var c Config
	for addr, want := range map[string]string{
		"0.0.0.0:8080":   "http://localhost:8080",
		"[::]:9000":      "http://localhost:9000",
		"127.0.0.1:4321": "http://127.0.0.1:4321",
	} {
		a, _ := net.ResolveTCPAddr("tcp", addr)
		u, derived := c.ExternalURLFor(a)
		if !derived || u.String() != want {
			t.Errorf("ExternalURLFor(%s) = %s, %v; want %s", addr, u, derived, want)
		}
		if cb := c.callbackURL(u); cb != want+"/callback" {
			t.Errorf("callback %s", cb)
		}
	}
	c.ExternalURL, _ = url.Parse("https://bind.example.com/kb/")
	a, _ := net.ResolveTCPAddr("tcp", "0.0.0.0:1")
	if u, derived := c.ExternalURLFor(a); derived || u.String() != "https://bind.example.com/kb/" {
		t.Errorf("configured external URL: %s %v", u, derived)
	}
	if cb := c.callbackURL(c.ExternalURL); cb != "https://bind.example.com/kb/callback" {
		t.Errorf("callback %s", cb)
	}
	c.OIDC.CallbackURL = "https://other.example.com/cb"
	if cb := c.callbackURL(c.ExternalURL); cb != c.OIDC.CallbackURL {
		t.Errorf("configured callback %s", cb)
	}
}
