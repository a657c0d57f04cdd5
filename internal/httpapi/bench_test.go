package httpapi

import (
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// benchWriter is a minimal ResponseWriter reused across iterations, so
// the figures are the router's, the handler's and the store's alone.
type benchWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) Write(b []byte) (int, error) { w.n += len(b); return len(b), nil }
func (w *benchWriter) reset()                      { clear(w.h); w.status = 0; w.n = 0 }

// BenchmarkPollPending: a signed poll of a pending session, through the
// real router, middleware, signature check and memory store, answered 403
// authorization_pending. Requests are signed outside the timer (that is
// the client's work), in batches.
func BenchmarkPollPending(b *testing.B) {
	info := slog.LevelInfo // as in production: pending polls log at debug
	e := newEnv(b, envOpts{ttl: 100000 * time.Hour, logLevel: &info})
	// Polls go round-robin over k sessions, each polled once per interval
	// and at most perSession times (the store bounds nonces per session).
	const k, perSession = 1000, 1000
	const batch = 10000
	var sess []v1alpha1.PollSession
	newSession := func() v1alpha1.PollSession {
		s, _, _ := e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: protocol.NewClusterID()})
		return v1alpha1.PollSession{SessionID: s.ID, SessionSecret: s.Secret}
	}
	pollURL, _ := url.Parse(testExternal + "/poll")
	reqs := make([]*http.Request, 0, batch)
	prepare := func(from, n int) {
		reqs = reqs[:0]
		for i := from; i < from+n; i++ {
			idx := i/(k*perSession)*k + i%k
			for idx >= len(sess) {
				sess = append(sess, newSession())
			}
			ps := sess[idx]
			u, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", pollURL, nil)
			if err != nil {
				b.Fatal(err)
			}
			reqs = append(reqs, httptest.NewRequest("GET", u.RequestURI(), nil))
		}
	}
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		b.StopTimer()
		prepare(done, n)
		b.StartTimer()
		for _, r := range reqs {
			e.clock.Advance(2 * time.Second / k)
			w.reset()
			e.handler.ServeHTTP(w, r)
			if w.status != http.StatusForbidden {
				b.Fatalf("status %d, want 403", w.status)
			}
		}
		done += n
	}
}

// BenchmarkCreateSession: POST /sessions presenting a clusterID, through
// the real router and memory store, answered 201.
func BenchmarkCreateSession(b *testing.B) {
	info := slog.LevelInfo
	e := newEnv(b, envOpts{logLevel: &info})
	body := `{"clusterID":"` + protocol.NewClusterID() + `"}`
	const batch = 10000
	reqs := make([]*http.Request, 0, batch)
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		b.StopTimer()
		reqs = reqs[:0]
		for i := 0; i < n; i++ {
			r := httptest.NewRequest("POST", "/sessions", strings.NewReader(body))
			reqs = append(reqs, r)
		}
		b.StartTimer()
		for _, r := range reqs {
			w.reset()
			e.handler.ServeHTTP(w, r)
			if w.status != http.StatusCreated {
				b.Fatalf("status %d, want 201", w.status)
			}
		}
		done += n
	}
}
