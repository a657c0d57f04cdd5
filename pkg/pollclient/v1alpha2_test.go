package pollclient

import (
	"context"
	"encoding/json"
	"errors"
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

// v1alpha2Provider is a scripted v1alpha2 provider: its document at
// /api/exports, sessions at /api/sessions, and every poll answered with
// response.
type v1alpha2Provider struct {
	srv *httptest.Server

	mu             sync.Mutex
	doc            v1alpha1.BindingProvider
	sessionVersion string
	response       []byte
	paths          []string
}

const v2SessionID = "sid-v1alpha2-0123456789"

func newV1alpha2Provider(t *testing.T) *v1alpha2Provider {
	f := &v1alpha2Provider{sessionVersion: v1alpha1.GroupVersion}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		switch r.Method + " " + r.URL.Path {
		case "GET /api/exports":
			writeJSON(w, http.StatusOK, f.doc)
		case "POST /api/sessions":
			w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
			writeJSON(w, http.StatusCreated, v1alpha1.PollSession{
				APIVersion: f.sessionVersion, Kind: v1alpha1.KindPollSession,
				SessionID: v2SessionID, ClusterID: "cid", SessionSecret: "c2VjcmV0LWZvci10ZXN0cy0wMDAwMDAwMDAwMDAwMDAwMA",
				ExpiresAt: time.Now().Add(10 * time.Minute).UTC().Truncate(time.Second),
			})
		case "GET /poll":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(f.response)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	base := f.srv.URL
	f.doc = v1alpha1.BindingProvider{
		APIVersion: v1alpha2.ProviderAPIVersion, Kind: v1alpha2.KindBindingProvider, ProviderPrettyName: "Fake", Version: "v0.8.2",
		AuthenticationMethods: []v1alpha1.AuthenticationMethod{
			{Method: v1alpha1.MethodOAuth2CodeGrantPoll, OAuth2CodeGrantPoll: &v1alpha1.OAuth2CodeGrantPoll{
				SessionURL: base + "/api/sessions", AuthenticatedURL: base + "/authorize", PollURL: base + "/poll", PollInterval: "1s"}},
			{Method: v1alpha1.MethodOAuth2CodeGrant, OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: base + "/api/authorize"}},
		},
	}
	f.response = v1alpha2Response(t, v2SessionID, v1alpha2.GroupVersion, v1alpha2.GroupVersion)
	return f
}

// v1alpha2Response is a BindingResponse of apiVersion respVersion with one
// request of apiVersion reqVersion.
func v1alpha2Response(t testing.TB, sid, respVersion, reqVersion string) []byte {
	t.Helper()
	req, err := json.Marshal(v1alpha2.APIServiceExportRequestResponse{
		APIVersion: reqVersion, Kind: v1alpha2.KindAPIServiceExportRequest, Metadata: v1alpha2.NameMeta{Name: "mangodbs.mangodb.com"},
		Spec: v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs", Versions: []string{"v1alpha1"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v1alpha2.BindingResponse{
		APIVersion: respVersion, Kind: v1alpha2.KindBindingResponse,
		Authentication: v1alpha2.BindingAuthentication{OAuth2CodeGrant: &v1alpha2.CodeGrantAuthentication{SessionID: sid, ID: "https://issuer.example/alice"}},
		Kubeconfig:     pollbackend.Kubeconfig(t, "https://provider.example:6443", "kube-bind-abc"),
		Requests:       []json.RawMessage{req}, ProviderNamespace: "kube-bind-abc", BindingName: "mangodbs.mangodb.com",
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *v1alpha2Provider) requested() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.paths...)
}

func TestProviderDocumentURLIsAtTheHostRoot(t *testing.T) {
	for in, want := range map[string]string{
		"https://bind.example.com/export":          "https://bind.example.com/api/exports",
		"https://bind.example.com":                 "https://bind.example.com/api/exports",
		"http://127.0.0.1:8080/prefix/export?x=1":  "http://127.0.0.1:8080/api/exports",
		"https://bind.example.com/api/exports#top": "https://bind.example.com/api/exports",
	} {
		got, err := ProviderDocumentURL(in)
		if err != nil || got != want {
			t.Errorf("ProviderDocumentURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"bind.example.com/export", "ftp://x/export", "https:///export"} {
		if _, err := ProviderDocumentURL(bad); err == nil {
			t.Errorf("ProviderDocumentURL(%q) accepted", bad)
		}
	}
}

func TestDiscoverV1alpha2(t *testing.T) {
	f := newV1alpha2Provider(t)
	c := New(nil)
	p, err := c.DiscoverV1alpha2(context.Background(), f.srv.URL+"/export")
	if err != nil {
		t.Fatal(err)
	}
	if p.Generation != v1alpha2.ProviderAPIVersion || p.SessionURL.Path != "/api/sessions" || p.ExportURL != f.srv.URL+"/api/exports" {
		t.Errorf("provider %+v", p)
	}
	if got := f.requested(); len(got) != 1 || got[0] != "GET /api/exports" {
		t.Errorf("requests %v, want only GET /api/exports", got)
	}

	// A v1alpha1 document there, or none, is not a v1alpha2 provider.
	f.mu.Lock()
	f.doc.APIVersion = v1alpha1.ProviderAPIVersion
	f.mu.Unlock()
	if _, err := c.DiscoverV1alpha2(context.Background(), f.srv.URL); !errors.Is(err, ErrUnsupportedProvider) {
		t.Errorf("a v1alpha1 document at /api/exports: %v, want ErrUnsupportedProvider", err)
	}
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	if _, err := c.DiscoverV1alpha2(context.Background(), other.URL+"/export"); !errors.Is(err, ErrUnsupportedProvider) {
		t.Errorf("no document: %v, want ErrUnsupportedProvider", err)
	}

	// The released backends' document offers only the callback flow.
	f.mu.Lock()
	f.doc.APIVersion = v1alpha2.ProviderAPIVersion
	f.doc.AuthenticationMethods = f.doc.AuthenticationMethods[1:]
	f.mu.Unlock()
	if _, err := c.DiscoverV1alpha2(context.Background(), f.srv.URL); !errors.Is(err, ErrNoPollMethod) {
		t.Errorf("callback flow only: %v, want ErrNoPollMethod", err)
	}
	// And v1alpha1 discovery refuses a v1alpha2 document.
	if _, err := c.FetchDocument(context.Background(), f.srv.URL+"/api/exports"); !errors.Is(err, ErrUnsupportedProvider) {
		t.Errorf("FetchDocument of a v1alpha2 document: %v, want ErrUnsupportedProvider", err)
	}
}

// A v1alpha2 session ends only in a kube-bind.io/v1alpha2 BindingResponse
// whose requests are all kube-bind.io/v1alpha2.
func TestV1alpha2SessionChecksTheResponseGeneration(t *testing.T) {
	cases := []struct {
		name           string
		sessionVersion string
		response       func(t *testing.T) []byte
		wantErr        error
	}{
		{"v1alpha2", v1alpha1.GroupVersion, func(t *testing.T) []byte {
			return v1alpha2Response(t, v2SessionID, v1alpha2.GroupVersion, v1alpha2.GroupVersion)
		}, nil},
		{"session labelled v1alpha2", v1alpha2.GroupVersion, func(t *testing.T) []byte {
			return v1alpha2Response(t, v2SessionID, v1alpha2.GroupVersion, v1alpha2.GroupVersion)
		}, nil},
		{"v1alpha1 response", v1alpha1.GroupVersion, func(t *testing.T) []byte {
			return pollbackend.BindingResponse(t, v2SessionID, "kube-bind-abc", "mangodbs.mangodb.com")
		}, ErrInvalidResponse},
		{"v1alpha1 request", v1alpha1.GroupVersion, func(t *testing.T) []byte {
			return v1alpha2Response(t, v2SessionID, v1alpha2.GroupVersion, v1alpha1.GroupVersion)
		}, ErrInvalidResponse},
		{"another session", v1alpha1.GroupVersion, func(t *testing.T) []byte {
			return v1alpha2Response(t, "sid-other", v1alpha2.GroupVersion, v1alpha2.GroupVersion)
		}, ErrInvalidResponse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newV1alpha2Provider(t)
			f.sessionVersion, f.response = tc.sessionVersion, tc.response(t)
			c := New(nil)
			p, err := c.DiscoverV1alpha2(context.Background(), f.srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			s, err := c.CreateSession(context.Background(), p, "")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := s.Wait(ctx)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Wait: %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Generation != v1alpha2.ProviderAPIVersion || res.Response.APIVersion != v1alpha2.GroupVersion ||
				res.Namespace != "kube-bind-abc" || res.ProviderNamespace != "kube-bind-abc" || len(res.Response.Requests) != 1 {
				t.Errorf("result %+v", res)
			}
			if !strings.Contains(string(res.Raw), `"bindingName"`) {
				t.Errorf("Raw lacks the v1alpha2 fields: %s", res.Raw)
			}
		})
	}
}

// A v1alpha1 provider's session may not call itself v1alpha2, and its
// responses must be v1alpha1.
func TestV1alpha1SessionRefusesV1alpha2(t *testing.T) {
	f := newV1alpha2Provider(t)
	f.sessionVersion = v1alpha2.GroupVersion
	c := New(nil)
	p, err := c.DiscoverV1alpha2(context.Background(), f.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p.Generation = v1alpha1.ProviderAPIVersion
	if _, err := c.CreateSession(context.Background(), p, ""); !errors.Is(err, ErrInvalidResponse) {
		t.Errorf("a v1alpha2 session from a v1alpha1 provider: %v, want ErrInvalidResponse", err)
	}
	var br v1alpha1.BindingResponse
	if err := json.Unmarshal(v1alpha2Response(t, "s", v1alpha2.GroupVersion, v1alpha2.GroupVersion), &br); err != nil {
		t.Fatal(err)
	}
	if _, err := ValidateBindingResponse(&br, "s"); !errors.Is(err, ErrInvalidResponse) {
		t.Errorf("ValidateBindingResponse of a v1alpha2 response: %v", err)
	}
}
