package flow

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// provider is a scripted provider of either or both generations: v1alpha1
// at /export (poll flow), v1alpha2 at /api/exports as v2 says.
type provider struct {
	srv *httptest.Server
	v2  string // "poll", "callback" (the released backends' document) or "" (none)

	mu    sync.Mutex
	paths []string
	gen   string // generation of the last session made
}

const sid = "sid-bindflow-0123456789"

func newProvider(t *testing.T, v2 string) *provider {
	p := &provider{v2: v2}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve(t)))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) serve(t *testing.T) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.paths = append(p.paths, r.Method+" "+r.URL.Path)
		base := p.srv.URL
		poll := func(sessionURL string) v1alpha1.AuthenticationMethod {
			return v1alpha1.AuthenticationMethod{Method: v1alpha1.MethodOAuth2CodeGrantPoll, OAuth2CodeGrantPoll: &v1alpha1.OAuth2CodeGrantPoll{
				SessionURL: base + sessionURL, AuthenticatedURL: base + "/authorize", PollURL: base + "/poll", PollInterval: "1s"}}
		}
		callback := v1alpha1.AuthenticationMethod{Method: v1alpha1.MethodOAuth2CodeGrant,
			OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: base + "/authorize"}}
		switch r.Method + " " + r.URL.Path {
		case "GET /export":
			writeJSON(w, http.StatusOK, v1alpha1.BindingProvider{APIVersion: v1alpha1.ProviderAPIVersion, Kind: "BindingProvider",
				Version: "v0.4.8", AuthenticationMethods: []v1alpha1.AuthenticationMethod{poll("/sessions"), callback}})
		case "GET /api/exports":
			doc := v1alpha1.BindingProvider{APIVersion: v1alpha2.ProviderAPIVersion, Kind: "BindingProvider", Version: "v0.8.2"}
			switch p.v2 {
			case "poll":
				doc.AuthenticationMethods = []v1alpha1.AuthenticationMethod{poll("/api/sessions"), callback}
			case "callback":
				doc.AuthenticationMethods = []v1alpha1.AuthenticationMethod{callback}
			default:
				http.NotFound(w, r)
				return
			}
			writeJSON(w, http.StatusOK, doc)
		case "POST /sessions", "POST /api/sessions":
			p.gen = v1alpha1.ProviderAPIVersion
			if r.URL.Path == "/api/sessions" {
				p.gen = v1alpha2.ProviderAPIVersion
			}
			w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
			writeJSON(w, http.StatusCreated, v1alpha1.PollSession{APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindPollSession,
				SessionID: sid, ClusterID: "cid", SessionSecret: "c2VjcmV0LWZvci10ZXN0cy0wMDAwMDAwMDAwMDAwMDAwMA",
				ExpiresAt: time.Now().Add(10 * time.Minute).UTC().Truncate(time.Second)})
		case "GET /poll":
			w.Header().Set("Content-Type", "application/json")
			body := pollbackend.BindingResponse(t, sid, "kube-bind-abc", "mangodbs.mangodb.com")
			if p.gen == v1alpha2.ProviderAPIVersion {
				// The same response, relabelled: the shape of the fields
				// the client reads is the same.
				s := strings.ReplaceAll(string(body), v1alpha1.GroupVersion, v1alpha2.GroupVersion)
				body = []byte(s)
			}
			_, _ = w.Write(body)
		default:
			http.NotFound(w, r)
		}
	}
}

func (p *provider) requested() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.paths, ", ")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestProtocolSelection(t *testing.T) {
	cases := []struct {
		name     string
		v2       string
		protocol string
		flow     string
		want     string // generation, or "error"
		notAsked string // a path that must not be requested
	}{
		{"auto prefers v1alpha2 with the poll flow", "poll", ProtocolAuto, FlowAuto, v1alpha2.ProviderAPIVersion, "GET /export"},
		{"auto falls back without /api/exports", "", ProtocolAuto, FlowAuto, v1alpha1.ProviderAPIVersion, ""},
		{"auto falls back when v1alpha2 offers only the callback flow", "callback", ProtocolAuto, FlowAuto, v1alpha1.ProviderAPIVersion, ""},
		{"auto with --flow poll prefers v1alpha2", "poll", ProtocolAuto, FlowPoll, v1alpha2.ProviderAPIVersion, "GET /export"},
		{"forced v1alpha1 does not look for v1alpha2", "poll", ProtocolV1alpha1, FlowAuto, v1alpha1.ProviderAPIVersion, "GET /api/exports"},
		{"forced v1alpha2", "poll", ProtocolV1alpha2, FlowAuto, v1alpha2.ProviderAPIVersion, "GET /export"},
		{"forced v1alpha2 without it", "", ProtocolV1alpha2, FlowAuto, "error", "GET /export"},
		{"forced v1alpha2 with the callback only", "callback", ProtocolV1alpha2, FlowAuto, "error", "GET /export"},
		{"forced v1alpha2 and the callback flow", "poll", ProtocolV1alpha2, FlowCallback, "error", "GET /api/exports"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, tc.v2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := Obtain(ctx, p.srv.URL+"/export", Options{Protocol: tc.protocol, Flow: tc.flow, Out: io.Discard})
			switch {
			case tc.want == "error":
				if err == nil {
					t.Fatalf("bound through %s, want an error", res.Protocol)
				}
				if tc.protocol == ProtocolV1alpha2 && tc.flow != FlowCallback && !strings.Contains(err.Error(), v1alpha2.GroupVersion) {
					t.Errorf("the error does not name the generation: %v", err)
				}
			case err != nil:
				t.Fatalf("Obtain: %v (requests: %s)", err, p.requested())
			case res.Protocol != tc.want || res.Generation != tc.want || res.Flow != FlowPoll:
				t.Errorf("bound through %s (%s flow), want %s poll", res.Protocol, res.Flow, tc.want)
			}
			if tc.notAsked != "" && strings.Contains(p.requested()+", ", tc.notAsked+", ") {
				t.Errorf("requested %s: %s", tc.notAsked, p.requested())
			}
		})
	}
}

// Choose decides as Obtain does from the discovery documents alone: it
// opens no session (a dry run relies on it).
func TestChooseOpensNoSession(t *testing.T) {
	cases := []struct {
		v2, flow          string
		wantGen, wantFlow string
	}{
		{"poll", FlowAuto, v1alpha2.ProviderAPIVersion, FlowPoll},
		{"", FlowAuto, v1alpha1.ProviderAPIVersion, FlowPoll},
		{"poll", FlowCallback, v1alpha1.ProviderAPIVersion, FlowCallback},
	}
	for _, tc := range cases {
		p := newProvider(t, tc.v2)
		ch, err := Choose(context.Background(), p.srv.URL+"/export", Options{Flow: tc.flow, Out: io.Discard})
		if err != nil {
			t.Fatalf("v2 %q, flow %q: %v", tc.v2, tc.flow, err)
		}
		if ch.Protocol != tc.wantGen || ch.Flow != tc.wantFlow || ch.ProviderName != "the provider" {
			t.Errorf("v2 %q, flow %q: chose %s, %s flow, %q; want %s, %s flow", tc.v2, tc.flow, ch.Protocol, ch.Flow, ch.ProviderName, tc.wantGen, tc.wantFlow)
		}
		if got := p.requested(); strings.Contains(got, "POST") {
			t.Errorf("v2 %q, flow %q: Choose made a session: %s", tc.v2, tc.flow, got)
		}
	}
}

// unfitErr is what a cluster's konnector says of a generation it cannot
// serve.
type unfitErr string

func (e unfitErr) Error() string { return string(e) }

func refusing(protocols ...string) func(string) error {
	return func(p string) error {
		for _, r := range protocols {
			if p == r {
				return unfitErr("konnector v0.4.8 serves only " + p + "-not")
			}
		}
		return nil
	}
}

// A generation the consumer cluster's konnector cannot serve is not
// taken: auto goes on with the other, a forced one is refused before the
// provider is asked, and the errors say why.
func TestChooseHonoursTheCluster(t *testing.T) {
	cases := []struct {
		name     string
		v2       string
		path     string // of the export URL
		protocol string
		refuse   []string
		want     string   // generation, or "" for an error
		words    []string // the error must hold
		asked    string   // the requests made, exactly ("" none)
	}{
		{name: "auto skips v1alpha2", v2: "poll", path: "/export", protocol: ProtocolAuto, refuse: []string{ProtocolV1alpha2},
			want: ProtocolV1alpha1, asked: "GET /export"},
		{name: "forced v1alpha2 refused at once", v2: "poll", path: "/export", protocol: ProtocolV1alpha2, refuse: []string{ProtocolV1alpha2},
			words: []string{"kube-bind.io/v1alpha2 does not fit this cluster", "konnector v0.4.8", "leave out --protocol"}},
		{name: "forced v1alpha1 refused at once", v2: "poll", path: "/export", protocol: ProtocolV1alpha1, refuse: []string{ProtocolV1alpha1},
			words: []string{"kube-bind.io/v1alpha1 does not fit this cluster"}},
		{name: "the provider offers only the generation that does not fit", v2: "poll", path: "/nothing", protocol: ProtocolAuto,
			refuse: []string{ProtocolV1alpha2}, words: []string{"offers kube-bind.io/v1alpha2 only", "404", "konnector v0.4.8"},
			asked: "GET /nothing, GET /api/exports"},
		{name: "none fits", v2: "poll", path: "/export", protocol: ProtocolAuto, refuse: []string{ProtocolV1alpha1, ProtocolV1alpha2},
			words: []string{"no protocol generation fits this cluster"}},
		{name: "v1alpha1 does not fit and v1alpha2 is not offered", v2: "", path: "/export", protocol: ProtocolAuto, refuse: []string{ProtocolV1alpha1},
			words: []string{"offers no kube-bind.io/v1alpha2 poll flow", "/api/exports"}, asked: "GET /api/exports"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, tc.v2)
			ch, err := Choose(context.Background(), p.srv.URL+tc.path, Options{Protocol: tc.protocol, Fits: refusing(tc.refuse...), Out: io.Discard})
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("chose %s, want an error", ch.Protocol)
			case tc.want != "" && err != nil:
				t.Fatalf("Choose: %v", err)
			case tc.want != "" && ch.Protocol != tc.want:
				t.Errorf("chose %s, want %s", ch.Protocol, tc.want)
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if got := p.requested(); got != tc.asked {
				t.Errorf("requested %q, want %q", got, tc.asked)
			}
		})
	}
}

// One reason that refuses both generations is said once.
func TestChooseSaysACommonReasonOnce(t *testing.T) {
	p := newProvider(t, "poll")
	_, err := Choose(context.Background(), p.srv.URL+"/export", Options{Out: io.Discard,
		Fits: func(string) error { return unfitErr("kbind v2 serves neither") }})
	if err == nil || strings.Count(err.Error(), "kbind v2 serves neither") != 1 || p.requested() != "" {
		t.Errorf("Choose = %v (requests %q), want the reason once and nothing asked", err, p.requested())
	}
}

// The callback flow has no session expiry: its wait for the browser is
// bounded, and ends with what to do.
func TestCallbackWaitIsBounded(t *testing.T) {
	p := newProvider(t, "")
	var out strings.Builder
	_, err := Obtain(context.Background(), p.srv.URL+"/export", Options{Flow: FlowCallback, CallbackWait: 50 * time.Millisecond, Out: &out})
	if !errors.Is(err, ErrCallbackTimeout) || !strings.Contains(err.Error(), "open the URL in a browser on this machine") {
		t.Fatalf("Obtain = %v, want ErrCallbackTimeout saying what to do", err)
	}
	if !strings.Contains(out.String(), "the link expires at") {
		t.Errorf("the wait's bound was not shown:\n%s", out.String())
	}
}
