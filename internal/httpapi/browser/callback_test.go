package browser

import (
	"net/url"
	"testing"
)

// The callback flow's u decides where a kubeconfig goes: only loopback
// http URLs and the allow-list may pass.
func TestCallbackURL(t *testing.T) {
	allow, errs := ParseCallbackAllowList([]string{"https://cli.example.com/kube-bind", "http://10.0.0.7:8000"})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, errs := ParseCallbackAllowList([]string{"cli.example.com", "https://x/cb?y=1", "https://ok.example.com"}); len(errs) != 2 {
		t.Errorf("two bad entries: %v", errs)
	}
	h := &Handler{allowList: allow}
	cases := []struct {
		query url.Values
		want  string // "" = refused
	}{
		{url.Values{"p": {"43210"}}, "http://localhost:43210/callback"},
		{url.Values{"u": {"http://127.0.0.1:5000/callback?x=1"}}, "http://127.0.0.1:5000/callback?x=1"},
		{url.Values{"u": {"http://[::1]:5000/cb"}}, "http://[::1]:5000/cb"},
		{url.Values{"u": {"http://localhost/cb"}}, "http://localhost/cb"},
		{url.Values{"u": {"https://cli.example.com/kube-bind/callback"}}, ""},
		{url.Values{"u": {"https://cli.example.com/kube-bind"}}, "https://cli.example.com/kube-bind"},
		{url.Values{"u": {"https://cli.example.com/kube-bind?x=1"}}, ""},
		{url.Values{"u": {"http://10.0.0.7:8000"}}, "http://10.0.0.7:8000"},
		{url.Values{"u": {"http://10.0.0.7:8000/"}}, "http://10.0.0.7:8000/"},
		{url.Values{"u": {"http://10.0.0.7:8000/anything"}}, ""},
		{url.Values{"u": {"https://cli.example.com/kube-bindevil"}}, ""},
		{url.Values{"u": {"https://cli.example.com/other"}}, ""},
		{url.Values{"u": {"http://cli.example.com/kube-bind/callback"}}, ""},
		{url.Values{"u": {"http://10.0.0.7:8001/anything"}}, ""},
		{url.Values{"u": {"https://127.0.0.1/cb"}}, ""},
		{url.Values{"u": {"http://127.0.0.1.evil.example.com/cb"}}, ""},
		{url.Values{"u": {"http://user@127.0.0.1:5000/cb"}}, ""},
		{url.Values{"u": {"http://127.0.0.1:5000/cb#frag"}}, ""},
		{url.Values{"u": {"//127.0.0.1:5000/cb"}}, ""},
		{url.Values{"u": {"javascript:alert(1)"}}, ""},
		{url.Values{"u": {"http://localhost:1/a", "http://localhost:2/b"}}, ""},
		{url.Values{"p": {"0"}}, ""},
		{url.Values{"p": {"65536"}}, ""},
		{url.Values{"p": {"80x"}}, ""},
		{url.Values{"p": {"+41234"}}, ""},
		{url.Values{"p": {"-1"}}, ""},
		{url.Values{"p": {" 8080"}}, ""},
		{url.Values{"p": {"08080"}}, ""},
		{url.Values{"p": {"080"}}, ""},
		{url.Values{"p": {"123456"}}, ""},
		{url.Values{"p": {"0x1F90"}}, ""},
		{url.Values{"p": {"65535"}}, "http://localhost:65535/callback"},
		{url.Values{"p": {"1"}}, "http://localhost:1/callback"},
		{url.Values{"u": {"http://localhost:99999/cb"}}, ""},
		{url.Values{"u": {"http://localhost:+5000/cb"}}, ""},
		{url.Values{"u": {"https://cli.example.com/kube-bind/../evil"}}, ""},
		{url.Values{"u": {"https://cli.example.com/kube-bind/%2E%2e/evil"}}, ""},
		{url.Values{"u": {"https://cli.example.com/kube-bind/./callback"}}, ""},
		{url.Values{"p": {"8080"}, "u": {"http://localhost/cb"}}, ""},
		{url.Values{}, ""},
	}
	for _, c := range cases {
		got, problem := h.callbackURL(c.query)
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%v: accepted %s", c.query, got)
		case c.want != "" && (got == nil || got.String() != c.want):
			t.Errorf("%v: got %v (%s), want %s", c.query, got, problem, c.want)
		case got == nil && problem == "":
			t.Errorf("%v: refused without saying why", c.query)
		}
	}
}

func TestAllowListRefusesNonURLs(t *testing.T) {
	for _, bad := range []string{"ftp://x.example.com", "https://", "https://x.example.com/?q=1", "https://u@x.example.com", "not a url"} {
		if _, errs := ParseCallbackAllowList([]string{bad}); len(errs) != 1 {
			t.Errorf("allow-list entry %q accepted", bad)
		}
	}
}
