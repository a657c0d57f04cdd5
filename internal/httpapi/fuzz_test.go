package httpapi

import (
	"encoding/json"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// FuzzCreateSessionBody: whatever the body, the answer is 201, 400 or 413,
// never a 5xx (a session is derived, not stored: nothing can be full) or a
// panic; and creating stores nothing.
func FuzzCreateSessionBody(f *testing.F) {
	for _, s := range []string{"", "{}", `{"clusterID":"aB3dE9"}`, `{"clusterID":1}`, `{"a":`, "null", `"x"`, strings.Repeat("[", 5000)} {
		f.Add(s)
	}
	e := newEnv(f, envOpts{})
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		e.handler.ServeHTTP(w, httptest.NewRequest("POST", "/sessions", strings.NewReader(body)))
		switch w.Code {
		case http.StatusCreated, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("body %q: status %d %s", body, w.Code, w.Body)
		}
		if got := e.stored(); got != [3]int{} {
			t.Fatalf("body %q: the store holds %v", body, got)
		}
	})
}

// FuzzPollQuery: whatever the query, a poll is answered with one of the
// codes of §4 (or 413), never a 5xx or a panic. The seeds include polls
// signed for a real session of the backend, pending and completed.
func FuzzPollQuery(f *testing.F) {
	for _, s := range []string{"", "s=a&n=b&h=c", "s=%zz", "s=a;n=b", "s=Zr7Q2mWbX9kLp3VtZr7Q2m&n=bm9uY2UtMDAwMQbm9uY2UtMDAwMQ&h=AAAA", "h=&h=&s"} {
		f.Add(s)
	}
	// The clock moves a poll interval per input, so that every signed poll
	// is admitted; sessions and the grace period outlast any fuzzing run.
	const long = 100000 * time.Hour
	e := newEnv(f, envOpts{ttl: long, limits: sessions.Limits{Grace: long}})
	sign := func(ps v1alpha1.PollSession, extra string) string {
		u, _ := url.Parse(testExternal + "/poll?" + extra)
		signed, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", u, nil)
		if err != nil {
			f.Fatal(err)
		}
		return signed.RawQuery
	}
	var completed string // the session whose response a poll may get
	for _, body := range []string{"", `{"clusterID":"aB3dE9"}`} {
		w := httptest.NewRecorder()
		e.handler.ServeHTTP(w, httptest.NewRequest("POST", "/sessions", strings.NewReader(body)))
		ps := v1alpha1.PollSession{}
		if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &ps) != nil {
			f.Fatalf("POST /sessions: %d %s", w.Code, w.Body)
		}
		if body != "" {
			completed = ps.SessionID
			e.complete(ps.SessionID, []byte(`{"kind":"BindingResponse"}`))
		}
		f.Add(sign(ps, ""))
		f.Add(sign(ps, "tenant=acme"))
		f.Add(sign(ps, "") + "&x=1")
		f.Add("s=" + ps.SessionID + "&n=bm9uY2UtMDAwMQbm9uY2UtMDAwMQ&h=AAAA")
	}
	f.Fuzz(func(t *testing.T, rawQuery string) {
		e.clock.Advance(pollsession.DefaultPollInterval)
		r := httptest.NewRequest("GET", "/poll", nil)
		r.URL.RawQuery = rawQuery
		w := httptest.NewRecorder()
		e.handler.ServeHTTP(w, r)
		switch w.Code {
		case 200, 400, 401, 403, 410, 413, 429:
		default:
			t.Fatalf("query %q: status %d %s", rawQuery, w.Code, w.Body)
		}
		if q, _ := url.ParseQuery(rawQuery); w.Code == 200 && q.Get("s") != completed {
			t.Fatalf("query %q: 200 for a session that is not completed: %s", rawQuery, w.Body)
		}
	})
}
