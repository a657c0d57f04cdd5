package browser

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/testutil/procs"
)

// A session store that is briefly unavailable (a replica slow or
// restarting) is a 503 "try again" page with Retry-After, a warning in
// the log: not the 410 "expired" page, not an error.
func TestStoreUnavailablePage(t *testing.T) {
	logs := &procs.Buffer{}
	h := &Handler{log: slog.New(slog.NewJSONHandler(logs, nil))}
	w := httptest.NewRecorder()
	h.storeFailed(w, fmt.Errorf("%w: the replica did not answer", sessions.ErrUnavailable))
	if w.Code != 503 || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "Reload this page") {
		t.Fatalf("unavailable store: %d, Retry-After %q:\n%s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) || !strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Fatalf("logged as:\n%s", logs)
	}
	w = httptest.NewRecorder()
	h.storeFailed(w, sessions.ErrNotFound)
	if w.Code != 410 {
		t.Fatalf("unknown session: %d, want 410", w.Code)
	}
}
