package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

func longPollEnv(t *testing.T, maxWait time.Duration, maxHeld int) (*env, *longpoll.Holder) {
	h := longpoll.New(longpoll.Options{MaxWait: maxWait, MaxHeld: maxHeld})
	return newEnv(t, envOpts{longPoll: h}), h
}

// pollAsync sends a signed poll with the given Prefer header in the
// background.
func (e *env) pollAsync(ps v1alpha1.PollSession, prefer string) <-chan *http.Response {
	u := e.pollURL(ps)
	ch := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("GET", strings.Replace(u, testExternal, e.srv.URL, 1), nil)
		if prefer != "" {
			req.Header.Set("Prefer", prefer)
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			e.t.Error(err)
			close(ch)
			return
		}
		e.t.Cleanup(func() { resp.Body.Close() })
		ch <- resp
	}()
	return ch
}

func held(t *testing.T, ch <-chan *http.Response) {
	t.Helper()
	select {
	case resp := <-ch:
		t.Fatalf("a long poll of a pending session was answered at once: %d %s", resp.StatusCode, readAll(t, resp))
	case <-time.After(200 * time.Millisecond):
	}
}

func answer(t *testing.T, ch <-chan *http.Response) *http.Response {
	t.Helper()
	select {
	case resp, ok := <-ch:
		if !ok {
			t.FailNow()
		}
		return resp
	case <-time.After(time.Minute):
		t.Fatal("the long poll was not answered")
		return nil
	}
}

func TestLongPollAnsweredOnComplete(t *testing.T) {
	e, _ := longPollEnv(t, 30*time.Second, 10)
	ps := e.createSession("")
	start := time.Now()
	ch := e.pollAsync(ps, "wait=20")
	held(t, ch)
	want := []byte(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"BindingResponse"}`)
	e.complete(ps.SessionID, want)
	resp := answer(t, ch)
	if took := time.Since(start); took >= 20*time.Second {
		t.Fatalf("answered after %s, not when the session completed", took)
	}
	b := readAll(t, resp)
	if resp.StatusCode != 200 || !bytes.Equal(b, want) {
		t.Fatalf("held poll after Complete: %d %s", resp.StatusCode, b)
	}
	wantCommonHeaders(t, resp)
	if got := resp.Header.Get("Preference-Applied"); got != "wait=20" {
		t.Errorf("Preference-Applied %q, want wait=20", got)
	}
	if first, err := e.store.Deliver(t.Context(), ps.SessionID, e.open(ps.SessionID).ExpiresAt); err != nil || !first.Equal(e.clock.Now()) || e.stored()[1] != 1 {
		t.Errorf("the response a long poll handed out does not count as delivered (%s, %v)", first, err)
	}
	e.wantMetrics(`kube_bind_backend_polls_total{outcome="completed"} 1`, "kube_bind_backend_long_polls_held 0")
}

func TestLongPollAnsweredOnDeny(t *testing.T) {
	e, _ := longPollEnv(t, 30*time.Second, 10)
	ps := e.createSession("")
	ch := e.pollAsync(ps, "respond-async, wait=25")
	held(t, ch)
	e.deny(ps.SessionID, "the user cancelled")
	if msg := wantError(t, answer(t, ch), 403, v1alpha1.ErrorAccessDenied); !strings.Contains(msg, "the user cancelled") {
		t.Errorf("message %q", msg)
	}
}

// After the wait (capped at the backend's maximum), the held poll is
// answered pending.
func TestLongPollPendingAfterWaitCapped(t *testing.T) {
	e, _ := longPollEnv(t, time.Second, 10)
	ps := e.createSession("")
	start := time.Now()
	resp := answer(t, e.pollAsync(ps, "wait=600"))
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Fatalf("answered after %s, before the wait of 1s was over", took)
	}
	if got := resp.Header.Get("Preference-Applied"); got != "wait=1" {
		t.Errorf("Preference-Applied %q, want the cap wait=1", got)
	}
	wantError(t, resp, 403, v1alpha1.ErrorAuthorizationPending)
	// The poll counted from its start: the next one is welcome a poll
	// interval after that.
	e.clock.Advance(2 * time.Second)
	wantError(t, e.poll(ps), 403, v1alpha1.ErrorAuthorizationPending)
}

// Polls that do not ask, ask wrongly, or ask for no wait are answered at
// once (no Preference-Applied), as are all of them with long polling off.
func TestLongPollNotAsked(t *testing.T) {
	on, _ := longPollEnv(t, 30*time.Second, 10)
	off := newEnv(t, envOpts{})
	for _, e := range []*env{on, off} {
		ps := e.createSession("")
		for _, prefer := range []string{"", "wait=soon", "wait=0", "wait", "wait=-3", "wait=1.5", "respond-async", `wait="30`} {
			resp := answer(t, e.pollAsync(ps, prefer))
			if got := resp.Header.Get("Preference-Applied"); got != "" {
				t.Errorf("Prefer %q: Preference-Applied %q", prefer, got)
			}
			wantError(t, resp, 403, v1alpha1.ErrorAuthorizationPending)
			e.clock.Advance(2 * time.Second)
		}
		// With long polling off even a valid wait is ignored.
		if e == off {
			resp := answer(t, e.pollAsync(ps, "wait=30"))
			if got := resp.Header.Get("Preference-Applied"); got != "" {
				t.Errorf("long polling off: Preference-Applied %q", got)
			}
			wantError(t, resp, 403, v1alpha1.ErrorAuthorizationPending)
		}
	}
}

// Beyond --max-long-polls, a poll that asks to wait is answered at once.
func TestLongPollLimit(t *testing.T) {
	e, h := longPollEnv(t, 30*time.Second, 1)
	first, second := e.createSession(""), e.createSession("")
	ch := e.pollAsync(first, "wait=30")
	held(t, ch)
	if h.Held() != 1 {
		t.Fatalf("held %d", h.Held())
	}
	resp := answer(t, e.pollAsync(second, "wait=30"))
	if got := resp.Header.Get("Preference-Applied"); got != "" {
		t.Errorf("a poll beyond the limit was held: Preference-Applied %q", got)
	}
	wantError(t, resp, 403, v1alpha1.ErrorAuthorizationPending)
	e.wantMetrics("kube_bind_backend_long_polls_refused_total 1", "kube_bind_backend_long_polls_held 1")
	e.complete(first.SessionID, []byte(`{}`))
	if resp := answer(t, ch); resp.StatusCode != 200 {
		t.Fatalf("held poll: %d", resp.StatusCode)
	}
	// The slot is free again.
	e.clock.Advance(2 * time.Second)
	ch = e.pollAsync(second, "wait=30")
	held(t, ch)
	e.complete(second.SessionID, []byte(`{}`))
	if resp := answer(t, ch); resp.StatusCode != 200 || resp.Header.Get("Preference-Applied") != "wait=30" {
		t.Fatalf("held poll after the slot was freed: %d %q", resp.StatusCode, resp.Header.Get("Preference-Applied"))
	}
}

// Shutdown releases held polls (answered pending at once) and holds no
// new ones.
func TestLongPollReleasedOnShutdown(t *testing.T) {
	e, h := longPollEnv(t, 30*time.Second, 10)
	ps := e.createSession("")
	ch := e.pollAsync(ps, "wait=30")
	held(t, ch)
	start := time.Now()
	h.Release()
	resp := answer(t, ch)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("released after %s", took)
	}
	wantError(t, resp, 403, v1alpha1.ErrorAuthorizationPending)
	e.clock.Advance(2 * time.Second)
	resp = answer(t, e.pollAsync(ps, "wait=30"))
	if got := resp.Header.Get("Preference-Applied"); got != "" {
		t.Errorf("a poll during shutdown was held: %q", got)
	}
	wantError(t, resp, 403, v1alpha1.ErrorAuthorizationPending)
}

func TestExportAdvertisesLongPoll(t *testing.T) {
	for _, tc := range []struct {
		holder *longpoll.Holder
		want   string
	}{
		{longpoll.New(longpoll.Options{MaxWait: 30 * time.Second, MaxHeld: 1}), "30s"},
		{nil, ""},
	} {
		e := newEnv(t, envOpts{longPoll: tc.holder})
		b := readAll(t, e.do("GET", "/export", nil))
		var doc v1alpha1.BindingProvider
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		if got := doc.AuthenticationMethods[0].OAuth2CodeGrantPoll.LongPollMaxWait; got != tc.want {
			t.Errorf("longPollMaxWait %q, want %q", got, tc.want)
		}
		if has := bytes.Contains(b, []byte("longPollMaxWait")); has != (tc.want != "") {
			t.Errorf("field present: %v in %s", has, b)
		}
	}
}

func (e *env) wantMetrics(lines ...string) {
	e.t.Helper()
	b := e.metricsText()
	for _, l := range lines {
		if !strings.Contains(b, l+"\n") {
			e.t.Errorf("metrics lack %q", l)
		}
	}
}
