package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/testutil/fakes"
)

// Behind TLS (an https external URL) every answer of the public handler
// pins HTTPS for a year, this host only (the provider's other hosts are
// not ours to pin); over plain http none does.
func TestHSTS(t *testing.T) {
	const want = "max-age=31536000"
	for _, c := range []struct {
		external string
		hsts     bool
	}{
		{"https://bind.example.com", true},
		{"HTTPS://bind.example.com/kb", true},
		{"http://127.0.0.1:8080", false},
		{"http://bind.example.com/kb", false},
	} {
		login := &fakes.Login{}
		e := newEnv(t, envOpts{external: c.external, login: login})
		prefix := strings.TrimSuffix(e.ext.Path, "/")
		ps := e.createSession("")
		type req struct {
			method, path, body string
			status             int
		}
		reqs := []req{
			{"GET", prefix + "/export", "", 200},
			{"POST", prefix + "/sessions", "", 201},
			{"POST", prefix + "/sessions", strings.Repeat("x", maxOtherBody+1), 413},
			{"GET", strings.TrimPrefix(e.signedURL(ps, e.ext.String()+"/poll"), e.ext.Scheme+"://"+e.ext.Host), "", 403},
			{"GET", prefix + "/poll?s=x", "", 400},
			{"GET", prefix + "/authorize", "", 400},
			{"GET", prefix + "/bind?s=x", "", 401},
			{"GET", "/nope", "", 404},
			{"DELETE", prefix + "/export", "", 405},
			{"GET", "/healthz", "", 200},
			{"GET", "/readyz", "", 200},
			{"GET", "/metrics", "", 404},
		}
		check := func(r req, resp *http.Response) {
			t.Helper()
			got := resp.Header.Values("Strict-Transport-Security")
			switch {
			case resp.StatusCode != r.status:
				t.Errorf("%s: %s %s: %d, want %d", c.external, r.method, r.path, resp.StatusCode, r.status)
			case c.hsts && (len(got) != 1 || got[0] != want):
				t.Errorf("%s: %s %s (%d): Strict-Transport-Security %q, want %q", c.external, r.method, r.path, resp.StatusCode, got, want)
			case !c.hsts && len(got) != 0:
				t.Errorf("%s: %s %s (%d): Strict-Transport-Security %q over plain http", c.external, r.method, r.path, resp.StatusCode, got)
			}
		}
		for _, r := range reqs {
			var resp *http.Response
			if r.body != "" {
				resp = e.do(r.method, r.path, strings.NewReader(r.body))
			} else {
				resp = e.do(r.method, r.path, nil)
			}
			readAll(t, resp)
			check(r, resp)
		}
		// A panic's 500 carries it too.
		login.Panic.Store(true)
		r := req{"GET", prefix + "/authorize?p=41234&s=aB3dE9&c=Zx81Qp", "", 500}
		resp := e.do(r.method, r.path, nil)
		readAll(t, resp)
		check(r, resp)
	}
}
