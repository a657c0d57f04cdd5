package browser

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/sessions"
)

// A session store that is briefly unavailable (the provider cluster
// unreachable) is a 503 "try again" page with Retry-After, a warning in
// the log: not the 410 "expired" page, not an error. A session that is
// not pending any more is 409; any other failure is an internal error
// the operator must see.
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

	logs = &procs.Buffer{}
	h.log = slog.New(slog.NewJSONHandler(logs, nil))
	w = httptest.NewRecorder()
	h.storeFailed(w, errors.New("the store broke"))
	if w.Code < 500 || strings.Contains(w.Body.String(), "Reload this page") || !strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("failing store: %d, logged as %s:\n%s", w.Code, logs, w.Body)
	}
}
