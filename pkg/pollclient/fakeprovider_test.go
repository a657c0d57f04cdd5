package pollclient

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// fakeProvider is a scripted provider for the narrow tests of retry and
// error handling. It checks every poll's signature and nonce like the real
// backend; the end-to-end tests use the real router instead.
type fakeProvider struct {
	t      *testing.T
	srv    *httptest.Server
	sid    string
	secret string

	mu          sync.Mutex
	doc         func(base string) v1alpha1.BindingProvider
	create      []answer // answers to POST /sessions, in order; then 201
	polls       []answer // answers to polls, in order; the last repeats
	pollCount   int
	nonces      map[string]bool
	createCalls int
	createBody  []byte
}

type answer func(w http.ResponseWriter, r *http.Request)

func newFakeProvider(t *testing.T) *fakeProvider {
	f := &fakeProvider{t: t, sid: "sid-0123456789abcdef", secret: "c2VjcmV0LWZvci10ZXN0cy0wMDAwMDAwMDAwMDAwMDAwMA", nonces: map[string]bool{}}
	f.doc = func(base string) v1alpha1.BindingProvider {
		return v1alpha1.BindingProvider{
			APIVersion: "v1alpha1", Kind: "BindingProvider", ProviderPrettyName: "Fake", Version: "v0.4.8",
			AuthenticationMethods: []v1alpha1.AuthenticationMethod{
				{Method: v1alpha1.MethodOAuth2CodeGrant, OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: base + "/authorize"}},
				{Method: v1alpha1.MethodOAuth2CodeGrantPoll, OAuth2CodeGrantPoll: &v1alpha1.OAuth2CodeGrantPoll{
					SessionURL: base + "/sessions", AuthenticatedURL: base + "/authorize?tenant=acme", PollURL: base + "/poll", PollInterval: "2s"}},
			},
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /export", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		doc := f.doc(f.srv.URL)
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, doc)
	})
	mux.HandleFunc("POST /sessions", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.createCalls++
		f.createBody = body
		var a answer
		if len(f.create) > 0 {
			a, f.create = f.create[0], f.create[1:]
		}
		f.mu.Unlock()
		if a != nil {
			a(w, r)
			return
		}
		var req v1alpha1.CreateSessionRequest
		_ = json.Unmarshal(body, &req)
		cid := req.ClusterID
		if cid == "" {
			cid = "newcid"
		}
		w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
		writeJSON(w, http.StatusCreated, v1alpha1.PollSession{
			APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindPollSession,
			SessionID: f.sid, ClusterID: cid, SessionSecret: f.secret,
			ExpiresAt: time.Now().Add(10 * time.Minute).UTC().Truncate(time.Second),
		})
	})
	mux.HandleFunc("GET /poll", func(w http.ResponseWriter, r *http.Request) {
		u := &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
		req, err := protocol.RequestFromURL(r.Method, u, nil)
		q := r.URL.Query()
		f.mu.Lock()
		defer f.mu.Unlock()
		if err != nil || q.Get("s") != f.sid || !protocol.Verify(f.secret, req, q.Get("h")) {
			t.Errorf("poll %s is not signed correctly", r.URL)
			writeJSON(w, http.StatusUnauthorized, v1alpha1.Error{Error: "invalid_signature", Message: "bad"})
			return
		}
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			t.Errorf("poll carries a body: length %d, transfer encoding %v", r.ContentLength, r.TransferEncoding)
		}
		if f.nonces[q.Get("n")] {
			t.Errorf("nonce %q used twice", q.Get("n"))
		}
		f.nonces[q.Get("n")] = true
		a := f.polls[min(f.pollCount, len(f.polls)-1)]
		f.pollCount++
		a(w, r)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeProvider) exportURL() string { return f.srv.URL + "/export" }

func (f *fakeProvider) polled() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pollCount
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func errAnswer(status int, code, msg string) answer {
	return func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, status, v1alpha1.Error{Error: code, Message: msg})
	}
}

func pending() answer {
	return errAnswer(http.StatusForbidden, v1alpha1.ErrorAuthorizationPending, "not yet")
}

func slowDown(retryAfter string) answer {
	return func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		writeJSON(w, http.StatusTooManyRequests, v1alpha1.Error{Error: v1alpha1.ErrorSlowDown, Message: "slow down"})
	}
}

// dropConnection closes the connection without an answer.
func dropConnection() answer {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
	}
}

func okAnswer(v any) answer {
	return func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, v) }
}
