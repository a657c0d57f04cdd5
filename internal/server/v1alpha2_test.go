package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// TestV1alpha2Routes: the server mounts the v1alpha2 routes at the host
// root; without an identity provider the document and poll sessions are
// served and the routes that need a login answer 503.
func TestV1alpha2Routes(t *testing.T) {
	logs := &procs.Buffer{}
	s, err := New(context.Background(), testConfig(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	}()
	base := "http://" + s.Addr().String()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		var resp *http.Response
		for range 50 {
			if resp, err = noRedirect.Do(req); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("GET", "/api/exports")
	var doc v1alpha2.BindingProvider
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &doc) != nil || doc.APIVersion != "v1alpha2" || len(doc.AuthenticationMethods) != 2 ||
		doc.AuthenticationMethods[1].OAuth2CodeGrant.AuthenticatedURL != base+"/api/authorize" {
		t.Errorf("GET /api/exports: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get("GET", "/exports"); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/api/exports" {
		t.Errorf("GET /exports: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, body := get("GET", "/api/templates"); resp.StatusCode != 503 || !strings.Contains(body, `"kind":"Error"`) {
		t.Errorf("GET /api/templates: %d %s", resp.StatusCode, body)
	}
	if resp, body := get("POST", "/api/sessions"); resp.StatusCode != 201 || !strings.Contains(body, `"apiVersion":"kube-bind.io/v1alpha2"`) {
		t.Errorf("POST /api/sessions: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get("GET", "/api/authorize?x=1"); resp.StatusCode != 503 {
		t.Errorf("GET /api/authorize: %d", resp.StatusCode)
	}
}
