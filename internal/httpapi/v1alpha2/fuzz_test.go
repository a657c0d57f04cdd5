package v1alpha2

import (
	"net/url"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kbprovider/backend/pkg/protocol"
)

// FuzzRedirectURL: ParseRedirectURL accepts only the released CLI's
// localhost callback, in the one spelling it prints: http, a loopback
// host, a port 1–65535 in digits, path /callback and nothing else; what it
// accepts parses again to itself.
func FuzzRedirectURL(f *testing.F) {
	for _, s := range []string{cliCallback, "http://localhost:8000/callback", "http://[::1]:1/callback",
		"https://127.0.0.1:1/callback", "http://127.0.0.1/callback", "http://127.0.0.1:1/callback/", "http://127.0.0.1:1/callback?x",
		"http://127.0.0.1:1/./callback", "http://127.0.0.1:1/%63allback", "http://u@127.0.0.1:1/callback", "http://127.0.0.1:+1/callback",
		"http://127.0.0.1:1\\@evil.com/callback", "//127.0.0.1:1/callback", "http://127.0.0.1.:1/callback", "http://0x7f.1:1/callback"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, ok := ParseRedirectURL(raw)
		if !ok {
			return
		}
		again, err := url.Parse(raw)
		if err != nil || again.String() != raw || u.String() != raw {
			t.Fatalf("accepted %q, which does not parse to itself", raw)
		}
		host := u.Hostname()
		port, err := strconv.Atoi(u.Port())
		if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != u.Port() {
			t.Fatalf("accepted %q, whose port is not 1 to 65535 in its plain spelling", raw)
		}
		if u.Scheme != "http" || (host != "127.0.0.1" && host != "localhost" && host != "::1") || u.Path != "/callback" ||
			u.RawQuery != "" || u.Fragment != "" || u.User != nil || strings.ContainsAny(raw, "\\%@ \t") {
			t.Fatalf("accepted %q", raw)
		}
	})
}

// FuzzLoginQuery: the queries of /api/authorize and / are accepted only
// with every parameter once and valid, and what is accepted is what the
// query said.
func FuzzLoginQuery(f *testing.F) {
	good := url.Values{"redirect_url": {cliCallback}, "session_id": {"ABCDEFGHIJKLMNOPQRSTUVWXYZ"}, "client_type": {"cli"}, "consumer_id": {"7f0c1b2e-aaaa-4bbb-8ccc-0123456789ab"}}
	f.Add(good.Encode())
	f.Add(good.Encode() + "&cluster_id=")
	f.Add(good.Encode() + "&cluster_id=c1")
	f.Add(good.Encode() + "&session_id=x")
	f.Add("redirect_url=http%3A%2F%2F127.0.0.1%3A1%2Fcallback&session_id=a&consumer_id=b")
	f.Add("redirect_url=%zz")
	f.Add("")
	f.Fuzz(func(t *testing.T, raw string) {
		q, qerr := url.ParseQuery(raw)
		if l, err := ParseLoginQuery(raw); err == nil {
			checkCommon(t, q, qerr, l.RedirectURL, l.SessionID)
			if ct := q["client_type"]; len(ct) > 1 || (len(ct) == 1 && ct[0] != "cli") {
				t.Fatalf("accepted client_type %q", ct)
			}
		}
		if b, err := ParseBrowserQuery(raw); err == nil {
			checkCommon(t, q, qerr, b.RedirectURL, b.SessionID)
			if len(q["consumer_id"]) != 1 || q.Get("consumer_id") != b.ConsumerID || !ValidClusterIdentity(b.ConsumerID) {
				t.Fatalf("accepted consumer_id %q", q["consumer_id"])
			}
		}
	})
}

func checkCommon(t *testing.T, q url.Values, qerr error, redirect, sid string) {
	t.Helper()
	if qerr != nil || len(q["redirect_url"]) != 1 || len(q["session_id"]) != 1 || q.Get("redirect_url") != redirect || q.Get("session_id") != sid {
		t.Fatalf("accepted %v as %q %q", q, redirect, sid)
	}
	if _, ok := ParseRedirectURL(redirect); !ok || !ValidSessionID(sid) {
		t.Fatalf("accepted redirect %q session %q", redirect, sid)
	}
	if c := q["cluster_id"]; len(c) > 1 || (len(c) == 1 && c[0] != "") {
		t.Fatalf("accepted cluster_id %q", c)
	}
}

// FuzzBindRequest: a bind body is accepted only with a valid name,
// template and cluster identity (never of the form of an issued cluster
// ID), and gives what it says.
func FuzzBindRequest(f *testing.F) {
	f.Add([]byte(bindBody("my-db", "mangodb-with-secrets", "2f1c-uid")))
	f.Add([]byte(`{"metadata":{"name":"n"},"spec":{"templateRef":{"name":"t"},"clusterIdentity":{"identity":"i"}}}`))
	f.Add([]byte(`{"apiVersion":"kube-bind.io/v1alpha2","kind":"BindableResourcesRequest","metadata":{"name":"n"},"spec":{"templateRef":{"name":"t"},"clusterIdentity":{"identity":"i","prettyName":"p"}}}`))
	f.Add([]byte(`{"metadata":{"name":"n"},"spec":{"templateRef":{"name":"t"},"clusterIdentity":{"identity":"i"}}} x`))
	f.Add([]byte(`{"metadata":{"name":"n"},"spec":{"templateRef":{"name":"t"},"clusterIdentity":{"identity":"i"}},"x":1}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(bindBody("n", "t", "abcdefghijklmnopqrstuvwxyz")))
	f.Add([]byte(bindBody("n", "t", "abcdefghijklmnopqrstuvwxy7")))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseBindRequest(body)
		if err != nil {
			if r != (BindRequest{}) {
				t.Fatalf("refused with a request %+v", r)
			}
			return
		}
		if len(validation.IsDNS1123Subdomain(r.Name)) > 0 || len(validation.IsDNS1123Subdomain(r.Template)) > 0 || !ValidClusterIdentity(r.ClusterIdentity) ||
			protocol.IssuedClusterID(r.ClusterIdentity) {
			t.Fatalf("accepted %+v", r)
		}
		again, err := ParseBindRequest([]byte(bindBody(r.Name, r.Template, r.ClusterIdentity)))
		if err != nil || again != r {
			t.Fatalf("%+v does not round-trip: %+v %v", r, again, err)
		}
	})
}
