package pollclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// The client's fuzz targets answer its requests from a RoundTripper that
// returns the fuzzed answer: no network, thousands of answers a second.

type cannedAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a *cannedAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body.Close()
	}
	return &http.Response{StatusCode: a.status, Header: a.header, Body: io.NopCloser(bytes.NewReader(a.body)), Request: r}, nil
}

const fuzzSID = "Zr7Q2mWbX9kLp3VtZr7Q2m"

// FuzzValidateBindingResponse: the BindingResponse a provider hands over,
// as its parts (the kubeconfig YAML, the requests, the session it names)
// or as a whole JSON body. An accepted one belongs to this session, has
// only APIServiceExportRequests, and a kubeconfig whose current context
// names a cluster with a server and a namespace, which is what the result
// says; it is still accepted after a round trip through JSON.
func FuzzValidateBindingResponse(f *testing.F) {
	kc := pollbackend.Kubeconfig(f, "https://provider.example:6443", "kube-bind-abc")
	req := `{"apiVersion":"kube-bind.io/v1alpha1","kind":"APIServiceExportRequest","metadata":{"name":"a.b"}}`
	for _, k := range [][]byte{
		kc, pollbackend.Kubeconfig(f, "", "ns"), pollbackend.Kubeconfig(f, "https://x", ""),
		bytes.ReplaceAll(kc, []byte("current-context: provider"), []byte("current-context: gone")),
		[]byte("{{{"), []byte("apiVersion: v1\nkind: Config\n"), []byte(`{"apiVersion":"v1","kind":"Config","current-context":"c","contexts":[{"name":"c","context":{"cluster":"x","namespace":"n"}}],"clusters":[{"name":"x","cluster":{"server":"s"}}]}`),
		[]byte("a: &a [*a, *a, *a, *a]\nb: *a\n"),
	} {
		f.Add(k, []byte("["+req+"]"), fuzzSID, fuzzSID, false)
	}
	f.Add(kc, []byte(`[{"apiVersion":"v1","kind":"APIServiceExportRequest"}]`), fuzzSID, fuzzSID, false)
	f.Add(kc, []byte(`[1, null]`), "other", fuzzSID, false)
	f.Add(kc, []byte(`[{"ApiVersion":"kube-bind.io/v1alpha1","Kind":"APIServiceExportRequest"}]`), fuzzSID, fuzzSID, false)
	f.Add(pollbackend.BindingResponse(f, fuzzSID, "kube-bind-abc", "mangodbs.mangodb.com"), []byte(nil), "", fuzzSID, true)
	f.Add([]byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"BindingResponse","authentication":{"oauth2CodeGrant":{"sid":"s"}},"kubeconfig":"e30="}`), []byte(nil), "", "s", true)
	f.Fuzz(func(t *testing.T, kubeconfig, requests []byte, respSID, sid string, whole bool) {
		var br v1alpha1.BindingResponse
		if whole {
			if json.Unmarshal(kubeconfig, &br) != nil {
				return
			}
		} else {
			br = v1alpha1.BindingResponse{
				APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindBindingResponse,
				Authentication: v1alpha1.BindingAuthentication{OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: respSID}},
				Kubeconfig:     kubeconfig,
			}
			_ = json.Unmarshal(requests, &br.Requests)
		}
		res, err := ValidateBindingResponse(&br, sid)
		if err != nil {
			if !errors.Is(err, ErrInvalidResponse) || res != nil {
				t.Fatalf("refusal %v (result %v) is not ErrInvalidResponse", err, res)
			}
			return
		}
		if br.APIVersion != v1alpha1.GroupVersion || br.Kind != v1alpha1.KindBindingResponse ||
			br.Authentication.OAuth2CodeGrant == nil || br.Authentication.OAuth2CodeGrant.SessionID != sid {
			t.Fatalf("accepted %s %s for session %q: %+v", br.APIVersion, br.Kind, sid, br.Authentication)
		}
		for _, raw := range br.Requests {
			var tm map[string]any
			if json.Unmarshal(raw, &tm) != nil || tm["apiVersion"] != v1alpha1.GroupVersion || tm["kind"] != v1alpha1.KindAPIServiceExportRequest {
				t.Fatalf("accepted request %s", raw)
			}
		}
		cfg, err := clientcmd.Load(br.Kubeconfig)
		if err != nil {
			t.Fatalf("accepted kubeconfig does not load: %v", err)
		}
		kctx := cfg.Contexts[cfg.CurrentContext]
		if kctx == nil || cfg.Clusters[kctx.Cluster] == nil || res.Server == "" || res.Server != cfg.Clusters[kctx.Cluster].Server ||
			res.Namespace == "" || res.Namespace != kctx.Namespace {
			t.Fatalf("result %s %s does not match the kubeconfig", res.Server, res.Namespace)
		}
		again, err := json.Marshal(&br)
		if err != nil {
			t.Fatal(err)
		}
		var br2 v1alpha1.BindingResponse
		if err := json.Unmarshal(again, &br2); err != nil {
			t.Fatal(err)
		}
		if res2, err := ValidateBindingResponse(&br2, sid); err != nil || res2.Server != res.Server || res2.Namespace != res.Namespace {
			t.Fatalf("after a JSON round trip: %v", err)
		}
	})
}

// FuzzPollAnswer: whatever status, Content-Type, Retry-After and body a
// poll is answered with, the client ends with a validated result or a
// classified error, or goes on in the state the answer calls for; waits
// are between 0 and a day; the provider's message is bounded.
func FuzzPollAnswer(f *testing.F) {
	good := pollbackend.BindingResponse(f, fuzzSID, "kube-bind-abc", "mangodbs.mangodb.com")
	for _, a := range []struct {
		status    int
		ct, retry string
		body      []byte
	}{
		{200, "application/json", "", good},
		{200, "text/html", "", good},
		{200, "", "", good[:len(good)/2]},
		{200, "application/json; charset=utf-8", "", []byte(`{}`)},
		{403, "application/json", "", []byte(`{"error":"authorization_pending","message":"not yet"}`)},
		{403, "application/json", "", []byte(`{"error":"access_denied","message":"the user cancelled"}`)},
		{403, "", "", []byte(`<html>forbidden</html>`)},
		{429, "application/json", "5", []byte(`{"error":"slow_down"}`)},
		{429, "", "Sun, 06 Nov 1994 08:49:37 GMT", nil},
		{429, "", "-3", nil},
		{429, "", "99999999999999999999", nil},
		{503, "", "30", []byte(`{"error":"temporarily_unavailable","message":"` + strings.Repeat("x", 3000) + `"}`)},
		{410, "application/json", "", []byte(`{"error":"expired_token"}`)},
		{401, "", "", nil},
		{302, "", "", nil},
		{418, "application/problem+json", "", []byte(`{"error":1}`)},
	} {
		f.Add(a.status, a.ct, a.retry, a.body)
	}
	answer := &cannedAnswer{}
	c := New(&http.Client{Transport: answer})
	c.MaxBodyBytes = 64 << 10
	now := time.Date(1994, 11, 6, 8, 49, 0, 0, time.UTC)
	c.now = func() time.Time { return now }
	pollURL, _ := url.Parse("https://bind.example.com/poll")
	s := &Session{ID: fuzzSID, provider: &Provider{PollURL: pollURL, PollInterval: 2 * time.Second}, client: c, secret: "secret"}
	f.Fuzz(func(t *testing.T, status int, contentType, retry string, body []byte) {
		if status < 100 || status > 999 {
			return
		}
		answer.status, answer.body, answer.header = status, body, http.Header{}
		if contentType != "" {
			answer.header.Set("Content-Type", contentType)
		}
		if retry != "" {
			answer.header.Set("Retry-After", retry)
		}
		p := s.poll(context.Background(), 0)
		if p.wait < 0 || p.wait > 24*time.Hour {
			t.Fatalf("wait %v", p.wait)
		}
		var se *ServerError
		if errors.As(p.err, &se) && len(se.Message) > 1024+len("…") {
			t.Fatalf("message of %d bytes", len(se.Message))
		}
		tooLarge := int64(len(body)) > c.MaxBodyBytes
		switch {
		case tooLarge:
			if p.state != "" || !errors.Is(p.err, ErrInvalidResponse) {
				t.Fatalf("a %d-byte answer: state %q, error %v", len(body), p.state, p.err)
			}
		case status == http.StatusOK:
			if p.state != "" || (p.result == nil) == (p.err == nil) {
				t.Fatalf("200: state %q, result %v, error %v", p.state, p.result, p.err)
			}
			if p.err != nil && !errors.Is(p.err, ErrInvalidResponse) {
				t.Fatalf("200 refused with %v", p.err)
			}
			if p.result != nil && (!bytes.Equal(p.result.Raw, body) || p.result.Namespace == "") {
				t.Fatalf("result %+v", p.result)
			}
		case status == http.StatusTooManyRequests:
			if p.state != StateSlowDown || p.err != nil {
				t.Fatalf("429: state %q, error %v", p.state, p.err)
			}
		case status >= 500:
			if p.state != StateRetrying || se == nil || se.StatusCode != status {
				t.Fatalf("%d: state %q, error %v", status, p.state, p.err)
			}
		case p.state == StatePending:
			if status != http.StatusForbidden || p.err != nil {
				t.Fatalf("%d: pending", status)
			}
		default:
			if p.state != "" || se == nil || se.StatusCode != status || p.result != nil {
				t.Fatalf("%d: state %q, result %v, error %v", status, p.state, p.result, p.err)
			}
			known := false
			for _, sentinel := range []error{ErrAccessDenied, ErrInvalidSignature, ErrExpired, ErrInvalidRequest, ErrInvalidResponse, ErrUnavailable} {
				known = known || errors.Is(p.err, sentinel)
			}
			if !known {
				t.Fatalf("%d: unclassified error %v", status, p.err)
			}
		}
	})
}

// FuzzDiscoveryAnswer: the provider's discovery document and the answer
// to session creation. An accepted provider names absolute http(s) URLs
// without user or fragment, a poll interval in (0, 1h], an accepted
// version; an accepted session has an ID, a secret, a cluster ID and an
// expiry, and never shows its secret when printed.
func FuzzDiscoveryAnswer(f *testing.F) {
	doc := func(poll string) []byte {
		return []byte(`{"apiVersion":"v1alpha1","kind":"BindingProvider","providerPrettyName":"P","version":"v0.4.8","authenticationMethods":[` +
			`{"method":"OAuth2CodeGrant","oauth2CodeGrant":{"authenticatedURL":"https://p.example.com/authorize"}},` +
			`{"method":"OAuth2CodeGrantPoll","oauth2CodeGrantPoll":` + poll + `}]}`)
	}
	session := []byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"PollSession","sessionID":"sid","sessionSecret":"c2VjcmV0LXNlY3JldC1zZWNyZXQ","clusterID":"abcdefghijklmnopqrstuvwxyz","expiresAt":"2026-11-21T10:10:00Z"}`)
	for _, d := range [][]byte{
		doc(`{"sessionURL":"https://p.example.com/sessions","authenticatedURL":"https://p.example.com/authorize","pollURL":"https://p.example.com/poll","pollInterval":"2s"}`),
		doc(`{"sessionURL":"https://u@p.example.com/sessions","authenticatedURL":"https://p.example.com/a#f","pollURL":"/poll","pollInterval":"2h"}`),
		doc(`{"sessionURL":"https://p.example.com/s","authenticatedURL":"https://p.example.com/a","pollURL":"https://p.example.com/p","pollInterval":"-1s"}`),
		doc(`{"sessionURL":"https://p.example.com/sessions","authenticatedURL":"https://p.example.com/authorize","pollURL":"https://p.example.com/poll","pollInterval":"2s","longPollMaxWait":"30s"}`),
		doc(`{"sessionURL":"https://p.example.com/sessions","authenticatedURL":"https://p.example.com/authorize","pollURL":"https://p.example.com/poll","pollInterval":"2s","longPollMaxWait":"2562047h"}`),
		doc(`{"sessionURL":"https://p.example.com/sessions","authenticatedURL":"https://p.example.com/authorize","pollURL":"https://p.example.com/poll","pollInterval":"2s","longPollMaxWait":"-1s"}`),
		doc(`null`),
		[]byte(`{"apiVersion":"v1alpha1","version":"v0.2.0"}`),
		[]byte(`{"apiVersion":"v1alpha1","version":"v0.0.0"}`),
	} {
		f.Add(d, "application/json", session, 201, "")
	}
	f.Add(doc(`{}`), "text/plain", []byte(`{}`), 503, "Sun, 06 Nov 1994 08:49:37 GMT")
	f.Add([]byte(`[`), "", []byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"PollSession","sessionID":"s","sessionSecret":"k","clusterID":"c"}`), 201, "garbage")
	answer := &cannedAnswer{}
	c := New(&http.Client{Transport: answer})
	c.MaxBodyBytes = 64 << 10
	c.sleep = func(context.Context, time.Duration) error { return nil }
	f.Fuzz(func(t *testing.T, docBody []byte, contentType string, sessionBody []byte, sessionStatus int, date string) {
		if sessionStatus < 100 || sessionStatus > 999 {
			return
		}
		answer.status, answer.body, answer.header = http.StatusOK, docBody, http.Header{"Content-Type": {contentType}}
		p, err := c.Discover(context.Background(), "https://p.example.com/export")
		if err != nil {
			if !errors.Is(err, ErrUnsupportedProvider) && !errors.Is(err, ErrNoPollMethod) && !errors.Is(err, ErrInvalidResponse) {
				t.Fatalf("discovery refused with an unclassified error: %v", err)
			}
			return
		}
		if p.Document.APIVersion != v1alpha1.ProviderAPIVersion || checkVersion(p.Version) != nil {
			t.Fatalf("accepted document %s %s", p.Document.APIVersion, p.Version)
		}
		for _, u := range []*url.URL{p.SessionURL, p.AuthenticatedURL, p.PollURL} {
			if u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
				t.Fatalf("accepted URL %v", u)
			}
		}
		if p.PollInterval <= 0 || p.PollInterval > time.Hour {
			t.Fatalf("accepted poll interval %v", p.PollInterval)
		}
		// Whatever the provider advertises, the wait asked for stays
		// within the client's cap and under its HTTP timeout.
		if w := (&Session{client: c, provider: p}).longPollWait(); w < 0 || w > maxLongPoll ||
			c.api.Timeout > 0 && w > c.api.Timeout-longPollSlack {
			t.Fatalf("long poll wait %v for an advertised %v", w, p.LongPollMaxWait)
		}

		answer.status, answer.body, answer.header = sessionStatus, sessionBody, http.Header{"Content-Type": {"application/json"}, "Date": {date}}
		s, err := c.CreateSession(context.Background(), p, "")
		if err != nil {
			if s != nil {
				t.Fatal("a session and an error")
			}
			return
		}
		if sessionStatus != http.StatusCreated || s.ID == "" || s.ClusterID == "" || s.secret == "" || s.ExpiresAt.IsZero() {
			t.Fatalf("accepted session %v from a %d answer", s, sessionStatus)
		}
		for _, shown := range []string{s.String(), s.GoString()} {
			if len(s.secret) >= 8 && strings.Contains(shown, s.secret) && !strings.Contains(s.ID+s.ClusterID, s.secret) {
				t.Fatalf("%q shows the secret", shown)
			}
		}
	})
}
