package callbackflow

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/pollclient"
)

func start(t *testing.T) (*Flow, *url.URL) {
	t.Helper()
	auth, _ := url.Parse("https://bind.example.com/authorize?tenant=acme")
	f, err := Start(auth, "aB3xY9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	u, err := url.Parse(f.URL())
	if err != nil {
		t.Fatal(err)
	}
	return f, u
}

func deliver(t *testing.T, u *url.URL, response string) int {
	t.Helper()
	cb := "http://127.0.0.1:" + u.Query().Get("p") + "/callback?response=" + url.QueryEscape(response)
	resp, err := http.Get(cb)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestCallbackTakesOnlyItsOwnSession(t *testing.T) {
	f, u := start(t)
	q := u.Query()
	if q.Get("c") != "aB3xY9" || q.Get("s") != f.SessionID() || q.Get("tenant") != "acme" || q.Get("p") == "" {
		t.Fatalf("URL %s lacks c, s, p or the provider's own query", u)
	}
	// Garbage and another session's response are refused; the flow keeps waiting.
	other := base64.StdEncoding.EncodeToString(pollbackend.BindingResponse(t, "someone-else", "ns", "a.b"))
	for _, bad := range []string{"", "%%%", base64.StdEncoding.EncodeToString([]byte("{")), other} {
		if code := deliver(t, u, bad); code != http.StatusBadRequest {
			t.Errorf("response %q: status %d, want 400", bad, code)
		}
	}
	good := pollbackend.BindingResponse(t, f.SessionID(), "kube-bind-abc", "mangodbs.mangodb.com")
	if code := deliver(t, u, base64.StdEncoding.EncodeToString(good)); code != http.StatusOK {
		t.Fatalf("good response: status %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := f.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Namespace != "kube-bind-abc" || string(res.Raw) != string(good) {
		t.Errorf("result namespace %q raw %s", res.Namespace, res.Raw)
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	f, _ := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.Wait(ctx); err == nil {
		t.Fatal("Wait returned without a response")
	}
}

// FuzzCallback feeds the callback handler arbitrary responses: it never
// panics, and accepts only a BindingResponse of its own session.
func FuzzCallback(f *testing.F) {
	f.Add(base64.StdEncoding.EncodeToString(pollbackend.BindingResponse(f, "sid", "ns", "a.b")))
	f.Add("")
	f.Add("e30=")
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"BindingResponse","authentication":{"oauth2CodeGrant":{"sid":"sid"}}}`)))
	f.Fuzz(func(t *testing.T, response string) {
		fl := &Flow{sessionID: "sid", results: make(chan *pollclient.Result, 1)}
		rec := &recorder{h: http.Header{}}
		r, _ := http.NewRequest(http.MethodGet, "/callback?response="+url.QueryEscape(response), nil)
		fl.callback(rec, r)
		if rec.code == http.StatusOK {
			res := <-fl.results
			var br struct {
				Authentication struct {
					OAuth2CodeGrant struct {
						SID string `json:"sid"`
					} `json:"oauth2CodeGrant"`
				} `json:"authentication"`
			}
			if err := json.Unmarshal(res.Raw, &br); err != nil || br.Authentication.OAuth2CodeGrant.SID != "sid" {
				t.Fatalf("accepted a response of another session: %s", res.Raw)
			}
		}
		if rec.code == 0 || strings.Contains(rec.body.String(), "<script") {
			t.Fatalf("status %d body %q", rec.code, rec.body.String())
		}
	})
}

type recorder struct {
	h    http.Header
	code int
	body strings.Builder
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(code int) { r.code = code }
