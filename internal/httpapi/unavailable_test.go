package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/fakes"

	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/sessions"
)

var errBriefly = fmt.Errorf("%w: the provider cluster did not answer", sessions.ErrUnavailable)

func flakyEnv(t *testing.T, only ...string) (*env, *fakes.FlakyStore) {
	flaky := &fakes.FlakyStore{}
	if len(only) > 0 {
		flaky.Only = map[string]bool{}
		for _, m := range only {
			flaky.Only[m] = true
		}
	}
	e := newEnv(t, envOpts{ttl: time.Minute, wrap: func(s sessions.Store) sessions.Store {
		flaky.Store = s
		return flaky
	}})
	return e, flaky
}

// A store that is briefly unavailable makes a poll 503 with Retry-After,
// logged as a warning: never 410 (the session is not lost), never an
// ERROR. Creating a session asks no store, so it goes on.
func TestUnavailableStoreIs503(t *testing.T) {
	e, flaky := flakyEnv(t)
	ps := e.createSession("")
	flaky.Down(errBriefly)
	resp := e.poll(ps)
	wantError(t, resp, 503, "temporarily_unavailable")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	// POST /sessions needs no store: 201 while it is down.
	e.createSession("")
	if strings.Contains(e.logs.String(), `"level":"ERROR"`) {
		t.Errorf("an unavailable store was logged as an error:\n%s", e.logs)
	}
	e.wantMetrics(`kube_bind_backend_polls_total{outcome="unavailable"} 1`)
	flaky.Up()
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(ps), 403, "authorization_pending")
}

// Each store call a poll makes answers 503 when it is unavailable; the
// one that records the first delivery too, so that no response is handed
// out whose delivery was not recorded.
func TestUnavailableAtEachStepOfAPoll(t *testing.T) {
	for _, method := range []string{"AdmitPoll", "Outcome", "Deliver"} {
		t.Run(method, func(t *testing.T) {
			e, flaky := flakyEnv(t, method)
			ps := e.createSession("")
			e.complete(ps.SessionID, []byte(`{"kind":"BindingResponse"}`))
			flaky.Down(errBriefly)
			wantError(t, e.poll(ps), 503, "temporarily_unavailable")
			if got := e.stored(); got[1] != 0 {
				t.Errorf("a refused poll recorded a delivery: %v", got)
			}
			flaky.Up()
			e.clock.Advance(2 * time.Second)
			if resp := e.poll(ps); resp.StatusCode != 200 {
				t.Fatalf("poll once the store is back: %d %s", resp.StatusCode, readAll(t, resp))
			}
		})
	}
}

// Another failure of the store is a 503 too (the client polls again),
// but logged as an error: an operator must look at it.
func TestFailingStoreIs503AndAnError(t *testing.T) {
	e, flaky := flakyEnv(t)
	ps := e.createSession("")
	flaky.Down(errors.New("the store broke"))
	wantError(t, e.poll(ps), 503, "temporarily_unavailable")
	if !strings.Contains(e.logs.String(), `"level":"ERROR"`) {
		t.Errorf("a failing store was not logged as an error:\n%s", e.logs)
	}
}

// While the store is unavailable, a long poll that asked to wait is
// answered pending (its wait failed), not held and not 5xx.
func TestUnavailableDuringLongPoll(t *testing.T) {
	flaky := &fakes.FlakyStore{Only: map[string]bool{"Wait": true}}
	e := newEnv(t, envOpts{longPoll: longpoll.New(longpoll.Options{MaxWait: 30 * time.Second, MaxHeld: 10}), wrap: func(s sessions.Store) sessions.Store {
		flaky.Store = s
		return flaky
	}})
	ps := e.createSession("")
	flaky.Down(errBriefly)
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", e.pollURL(ps), nil)
	r.Header.Set("Prefer", "wait=20")
	start := time.Now()
	e.handler.ServeHTTP(w, r)
	if w.Code != 403 || !strings.Contains(w.Body.String(), "authorization_pending") || time.Since(start) > 10*time.Second {
		t.Fatalf("long poll while Wait fails: %d after %s: %s", w.Code, time.Since(start), w.Body)
	}
}

// A store call ended by the request's own cancellation (the client left,
// or the server is stopping) is no failure of the store: a 503 that
// nobody reads, and no ERROR an operator would chase.
func TestCanceledStoreCallIsNoError(t *testing.T) {
	for _, method := range []string{"AdmitPoll", "Outcome", "Deliver"} {
		t.Run(method, func(t *testing.T) {
			e, flaky := flakyEnv(t, method)
			ps := e.createSession("")
			e.complete(ps.SessionID, []byte(`{"kind":"BindingResponse"}`))
			flaky.Down(fmt.Errorf("reading the session: %w", context.Canceled))
			wantError(t, e.poll(ps), 503, "temporarily_unavailable")
			if strings.Contains(e.logs.String(), `"level":"ERROR"`) {
				t.Errorf("a canceled store call was logged as an error:\n%s", e.logs)
			}
			if got := e.stored(); got[1] != 0 {
				t.Errorf("a canceled poll recorded a delivery: %v", got)
			}
			e.wantMetrics(`kube_bind_backend_polls_total{outcome="canceled"} 1`,
				`kube_bind_backend_polls_total{outcome="unavailable"} 0`)
		})
	}
}
