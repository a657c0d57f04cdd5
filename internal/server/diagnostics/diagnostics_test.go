package diagnostics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/server/health"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// /readyz follows only the readiness checks and lists them; /statusz
// adds each dependency's last observed state; /metrics serves the
// registry.
func TestHandler(t *testing.T) {
	shutdown := health.NewStatus("shutdown", nil)
	reg := prometheus.NewRegistry()
	idp := health.CheckFunc("oidc", func(context.Context) error { return errors.New("dial tcp 10.1.2.3:443: connection refused") })
	mon, err := health.NewMonitor(reg, []health.Check{idp}, health.MonitorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := New(Config{Readiness: []health.Check{shutdown}, Dependencies: mon, Metrics: reg})

	if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, h, "/statusz"); code != 200 || !strings.Contains(body, "[?]oidc not checked yet") {
		t.Errorf("/statusz before the first look: %d %q", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); mon.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := get(t, h, "/statusz")
		if strings.Contains(body, "[-]oidc failed: dial tcp 10.1.2.3:443: connection refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/statusz never showed the failing dependency:\n%s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A failing dependency leaves the replica ready.
	if code, body := get(t, h, "/readyz"); code != 200 || body != "[+]shutdown ok\nready\n" {
		t.Errorf("/readyz with the IdP down: %d %q", code, body)
	}
	if code, body := get(t, h, "/metrics"); code != 200 || !strings.Contains(body, `kube_bind_backend_dependency_up{dependency="oidc"} 0`) {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	shutdown.Set(errors.New("shutting down"))
	if code, body := get(t, h, "/readyz"); code != 503 || body != "[-]shutdown failed: shutting down\nnot ready\n" {
		t.Errorf("/readyz at shutdown: %d %q", code, body)
	}
	if code, _ := get(t, h, "/export"); code != 404 {
		t.Errorf("/export on the diagnostics handler: %d, want 404", code)
	}
}

// Profiles are served only when asked for: off, /debug/pprof/ is a 404.
func TestProfilingOnlyWhenAsked(t *testing.T) {
	if code, _ := get(t, New(Config{}), "/debug/pprof/heap"); code != http.StatusNotFound {
		t.Errorf("profiling off: /debug/pprof/heap answered %d, want 404", code)
	}
	h := New(Config{Profiling: true})
	code, body := get(t, h, "/debug/pprof/heap?debug=1")
	if code != http.StatusOK || !strings.Contains(body, "heap profile:") {
		t.Errorf("profiling on: /debug/pprof/heap?debug=1: %d %.100q", code, body)
	}
	if code, _ := get(t, h, "/debug/pprof/"); code != http.StatusOK {
		t.Errorf("profiling on: /debug/pprof/ answered %d", code)
	}
}
