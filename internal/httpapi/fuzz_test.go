package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/sessions"
)

// FuzzCreateSessionBody: whatever the body, the answer is 201, 400 or 413,
// never a 5xx or a panic.
func FuzzCreateSessionBody(f *testing.F) {
	for _, s := range []string{"", "{}", `{"clusterID":"aB3dE9"}`, `{"clusterID":1}`, `{"a":`, "null", `"x"`, strings.Repeat("[", 5000)} {
		f.Add(s)
	}
	e := newEnv(f, envOpts{limits: sessions.Limits{MaxSessions: 1 << 30}})
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		e.handler.ServeHTTP(w, httptest.NewRequest("POST", "/sessions", strings.NewReader(body)))
		switch w.Code {
		case http.StatusCreated, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("body %q: status %d %s", body, w.Code, w.Body)
		}
	})
}

// FuzzPollQuery: whatever the query, a poll is answered with one of the
// codes of §4 (or 413), never a 5xx or a panic.
func FuzzPollQuery(f *testing.F) {
	for _, s := range []string{"", "s=a&n=b&h=c", "s=%zz", "s=a;n=b", "s=Zr7Q2mWbX9kLp3VtZr7Q2m&n=bm9uY2UtMDAwMQbm9uY2UtMDAwMQ&h=AAAA", "h=&h=&s"} {
		f.Add(s)
	}
	e := newEnv(f, envOpts{})
	f.Fuzz(func(t *testing.T, rawQuery string) {
		r := httptest.NewRequest("GET", "/poll", nil)
		r.URL.RawQuery = rawQuery
		w := httptest.NewRecorder()
		e.handler.ServeHTTP(w, r)
		switch w.Code {
		case 400, 401, 403, 410, 413, 429:
		default:
			t.Fatalf("query %q: status %d %s", rawQuery, w.Code, w.Body)
		}
	})
}
