package browser

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A session store that is briefly unavailable (the provider cluster
// unreachable) is a 503 "try again" page with Retry-After, a warning in
// the log: not the 410 "expired" page, not an error. A session that is
// not pending any more is 409; a call the request's end canceled is
// logged below ERROR; any other failure is an internal error the
// operator must see.
func TestStoreUnavailablePage(t *testing.T) {
	logs := &procs.Buffer{}
	h := &Handler{log: slog.New(slog.NewJSONHandler(logs, nil))}
	w := httptest.NewRecorder()
	h.storeFailed(w, fmt.Errorf("%w: the provider cluster did not answer", sessions.ErrUnavailable))
	if w.Code != 503 || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "Reload this page") {
		t.Fatalf("unavailable store: %d, Retry-After %q:\n%s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) || !strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Fatalf("logged as:\n%s", logs)
	}

	w = httptest.NewRecorder()
	h.storeFailed(w, sessions.ErrNotPending)
	if w.Code != 409 || !strings.Contains(w.Body.String(), "Already bound") {
		t.Fatalf("session not pending: %d, want 409:\n%s", w.Code, w.Body)
	}

	// The browser left (or the server stops) while the store worked:
	// nothing for an operator.
	logs = &procs.Buffer{}
	h.log = slog.New(slog.NewJSONHandler(logs, nil))
	w = httptest.NewRecorder()
	h.storeFailed(w, fmt.Errorf("reading the session: %w", context.Canceled))
	if w.Code != 503 || strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("canceled store call: %d, logged as:\n%s", w.Code, logs)
	}

	logs = &procs.Buffer{}
	h.log = slog.New(slog.NewJSONHandler(logs, nil))
	w = httptest.NewRecorder()
	h.storeFailed(w, errors.New("the store broke"))
	if w.Code < 500 || strings.Contains(w.Body.String(), "Reload this page") || !strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("failing store: %d, logged as %s:\n%s", w.Code, logs, w.Body)
	}
}

// A provisioning failure the provider cluster will not repeat in a
// moment (overloaded, a timeout) is 503 with Retry-After and a warning;
// any other (the backend's own RBAC refused) is 502 and an error.
func TestProvisionFailedPage(t *testing.T) {
	gr := schema.GroupResource{Resource: "namespaces"}
	for _, c := range []struct {
		name      string
		err       error
		code      int
		level     string
		retryHint bool
	}{
		{"overloaded", apierrors.NewTooManyRequests("slow down", 1), 503, "WARN", true},
		{"timeout", apierrors.NewServerTimeout(gr, "create", 1), 503, "WARN", true},
		{"forbidden", apierrors.NewForbidden(gr, "kb-x", errors.New("no RBAC")), 502, "ERROR", false},
	} {
		logs := &procs.Buffer{}
		h := &Handler{log: slog.New(slog.NewJSONHandler(logs, nil))}
		w := httptest.NewRecorder()
		h.provisionFailed(w, fmt.Errorf("%w: %w", lifecycle.ErrProvisioning, c.err), "session", "s")
		if w.Code != c.code || (w.Header().Get("Retry-After") != "") != c.retryHint {
			t.Errorf("%s: %d, Retry-After %q; want %d", c.name, w.Code, w.Header().Get("Retry-After"), c.code)
		}
		if !strings.Contains(logs.String(), `"level":"`+c.level+`"`) || !strings.Contains(w.Body.String(), "could not be set up") {
			t.Errorf("%s: logged as %s, page:\n%s", c.name, logs, w.Body)
		}
	}
}
