package pollclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

var fakeStart = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestDiscoverChecksVersionAndAPIVersion(t *testing.T) {
	cases := []struct {
		apiVersion, version string
		ok                  bool
	}{
		{"v1alpha1", "v0.4.8", true},
		{"v1alpha1", "v0.3.0", true},
		{"v1alpha1", "v1.2.3", true},
		{"v1alpha1", "0.4.8", true},
		{"v1alpha1", "v0.0.0", true},
		{"v1alpha1", "v0.2.9", false},
		{"v1alpha1", "v0.3.0-rc.1", false},
		{"v1alpha1", "v0.4", false},
		{"v1alpha1", "latest", false},
		{"v1alpha1", "", false},
		{"kube-bind.io/v1alpha1", "v0.4.8", false},
		{"", "v0.4.8", false},
	}
	for _, tc := range cases {
		t.Run(tc.apiVersion+"/"+tc.version, func(t *testing.T) {
			f := newFakeProvider(t)
			orig := f.doc
			f.doc = func(base string) v1alpha1.BindingProvider {
				d := orig(base)
				d.APIVersion, d.Version = tc.apiVersion, tc.version
				return d
			}
			p, err := New(nil).Discover(context.Background(), f.exportURL())
			if tc.ok {
				if err != nil {
					t.Fatalf("Discover: %v", err)
				}
				if p.PollInterval != 2*time.Second || p.PollURL.String() != f.srv.URL+"/poll" || p.PrettyName != "Fake" {
					t.Errorf("provider = %+v", p)
				}
				return
			}
			if !errors.Is(err, ErrUnsupportedProvider) {
				t.Fatalf("Discover = %v, want ErrUnsupportedProvider", err)
			}
		})
	}
}

func TestDiscoverOnlyCallbackFlow(t *testing.T) {
	f := newFakeProvider(t)
	orig := f.doc
	f.doc = func(base string) v1alpha1.BindingProvider {
		d := orig(base)
		d.AuthenticationMethods = d.AuthenticationMethods[:1]
		return d
	}
	_, err := New(nil).Discover(context.Background(), f.exportURL())
	if !errors.Is(err, ErrNoPollMethod) || !strings.Contains(err.Error(), "callback flow") {
		t.Fatalf("Discover = %v, want ErrNoPollMethod naming the callback flow", err)
	}
}

func TestDiscoverRejectsBadPollMethod(t *testing.T) {
	for name, mutate := range map[string]func(*v1alpha1.OAuth2CodeGrantPoll){
		"relative poll URL": func(m *v1alpha1.OAuth2CodeGrantPoll) { m.PollURL = "/poll" },
		"ftp session URL":   func(m *v1alpha1.OAuth2CodeGrantPoll) { m.SessionURL = "ftp://x/sessions" },
		"bad interval":      func(m *v1alpha1.OAuth2CodeGrantPoll) { m.PollInterval = "2" },
		"zero interval":     func(m *v1alpha1.OAuth2CodeGrantPoll) { m.PollInterval = "0s" },
		"missing interval":  func(m *v1alpha1.OAuth2CodeGrantPoll) { m.PollInterval = "" },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeProvider(t)
			orig := f.doc
			f.doc = func(base string) v1alpha1.BindingProvider {
				d := orig(base)
				mutate(d.AuthenticationMethods[1].OAuth2CodeGrantPoll)
				return d
			}
			if _, err := New(nil).Discover(context.Background(), f.exportURL()); !errors.Is(err, ErrUnsupportedProvider) {
				t.Fatalf("Discover = %v, want ErrUnsupportedProvider", err)
			}
		})
	}
}

// The export URL is fetched exactly as given (query kept, no path added),
// and redirects are followed, as released CLIs do.
func TestDiscoverFetchesExactURLAndFollowsRedirects(t *testing.T) {
	f := newFakeProvider(t)
	var got string
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.RequestURI()
		http.Redirect(w, r, f.exportURL(), http.StatusFound)
	}))
	defer front.Close()
	p, err := New(nil).Discover(context.Background(), front.URL+"/custom/path?x=1")
	if err != nil {
		t.Fatal(err)
	}
	if got != "/custom/path?x=1" {
		t.Errorf("requested %q, want the URL exactly as given", got)
	}
	if p.SessionURL.String() != f.srv.URL+"/sessions" {
		t.Errorf("session URL = %s", p.SessionURL)
	}
}

func TestDiscoverErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			writeJSON(w, http.StatusNotFound, v1alpha1.Error{Error: "not_found", Message: "no export here"})
		case "/html":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html>login</html>"))
		case "/huge":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"apiVersion":"` + strings.Repeat("x", 5<<20) + `"}`))
		}
	}))
	defer srv.Close()
	c := New(nil)
	for path, want := range map[string]string{
		"/missing": "no export here",
		"/html":    "not JSON",
		"/huge":    "larger than",
	} {
		if _, err := c.Discover(context.Background(), srv.URL+path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Discover = %v, want an error containing %q", path, err, want)
		}
	}
	if _, err := c.Discover(context.Background(), "bind.example.com/export"); err == nil {
		t.Error("a URL without scheme was accepted")
	}
}

func TestCreateSessionPresentsClusterID(t *testing.T) {
	f := newFakeProvider(t)
	c := New(nil)
	p := discover(t, c, f)
	s, err := c.CreateSession(context.Background(), p, "oldcid")
	if err != nil {
		t.Fatal(err)
	}
	if s.ClusterID != "oldcid" || string(f.createBody) != `{"clusterID":"oldcid"}` {
		t.Errorf("cluster ID %q, body sent %q", s.ClusterID, f.createBody)
	}
	s, err = c.CreateSession(context.Background(), p, "")
	if err != nil {
		t.Fatal(err)
	}
	if s.ClusterID != "newcid" || len(f.createBody) != 0 {
		t.Errorf("cluster ID %q, body sent %q; want a new ID and an empty body", s.ClusterID, f.createBody)
	}
}

func TestCreateSessionRetriesWhenFull(t *testing.T) {
	f := newFakeProvider(t)
	full := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3")
		writeJSON(w, http.StatusServiceUnavailable, v1alpha1.Error{Error: "temporarily_unavailable", Message: "full"})
	}
	f.create = []answer{full, full}
	c := New(nil)
	ft := installFakeTime(c, fakeStart)
	p := discover(t, c, f)
	if _, err := c.CreateSession(context.Background(), p, ""); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ft.Sleeps()); got != "[3s 3s]" || f.createCalls != 3 {
		t.Errorf("slept %s over %d calls, want [3s 3s] over 3", got, f.createCalls)
	}

	f.create = []answer{full, full, full, full, full}
	_, err := c.CreateSession(context.Background(), p, "")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "full") {
		t.Errorf("CreateSession against a full provider = %v", err)
	}

	f.create = []answer{errAnswer(http.StatusBadRequest, "invalid_request", "clusterID is malformed")}
	_, err = c.CreateSession(context.Background(), p, "bad id")
	var se *ServerError
	if !errors.Is(err, ErrInvalidRequest) || !errors.As(err, &se) || se.Message != "clusterID is malformed" {
		t.Errorf("CreateSession with a bad cluster ID = %v", err)
	}
}

// discover asks the fake provider for its export with c.
func discover(t *testing.T, c *Client, f *fakeProvider) *Provider {
	t.Helper()
	p, err := c.Discover(context.Background(), f.exportURL())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// open discovers the fake provider and opens a session with fake time.
func open(t *testing.T, f *fakeProvider) (*Session, *fakeTime) {
	t.Helper()
	c := New(nil)
	ft := installFakeTime(c, fakeStart)
	s, err := c.CreateSession(context.Background(), discover(t, c, f), "")
	if err != nil {
		t.Fatal(err)
	}
	return s, ft
}

func TestWaitHonoursIntervalAndRetryAfter(t *testing.T) {
	f := newFakeProvider(t)
	s, ft := open(t, f)
	want := bindingResponse(t, f.sid)
	httpDate := fakeStart.Add(9 * time.Second).Format(http.TimeFormat)
	f.polls = []answer{
		pending(),
		slowDown("7"),
		slowDown(""), // no Retry-After: the interval
		func(w http.ResponseWriter, r *http.Request) {
			// An HTTP date; the fake clock then reads fakeStart+11s.
			w.Header().Set("Retry-After", httpDate)
			writeJSON(w, http.StatusTooManyRequests, v1alpha1.Error{Error: "slow_down"})
		},
		pending(),
		okAnswer(want),
	}
	var progress []string
	res, err := s.Wait(context.Background(), WithProgress(func(p Progress) {
		progress = append(progress, fmt.Sprintf("%d:%s:%d:%s", p.Attempt, p.State, p.StatusCode, p.Wait))
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ft.Sleeps()); got != "[2s 7s 2s 250ms 2s]" {
		// 9s after fakeStart is 250ms-floored: the clock read 11s by then.
		t.Errorf("waits = %s", got)
	}
	wantProgress := "[1:pending:403:2s 2:slow_down:429:7s 3:slow_down:429:2s 4:slow_down:429:250ms 5:pending:403:2s]"
	if got := fmt.Sprint(progress); got != wantProgress {
		t.Errorf("progress = %s, want %s", got, wantProgress)
	}
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(res.Response)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("response = %s, want %s", gotJSON, wantJSON)
	}
	if !bytes.Contains(res.Raw, []byte(`"sid":"`+f.sid+`"`)) || res.Namespace != "kube-bind-abc" || res.Server != "https://provider.example:6443" {
		t.Errorf("result = raw %s, namespace %q, server %q", res.Raw, res.Namespace, res.Server)
	}
	if f.polled() != 6 {
		t.Errorf("polled %d times, want 6", f.polled())
	}
}

func TestWaitHTTPDateRetryAfter(t *testing.T) {
	f := newFakeProvider(t)
	s, ft := open(t, f)
	f.polls = []answer{
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", fakeStart.Add(5*time.Second).Format(http.TimeFormat))
			writeJSON(w, http.StatusTooManyRequests, v1alpha1.Error{Error: "slow_down"})
		},
		okAnswer(bindingResponse(t, f.sid)),
	}
	if _, err := s.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ft.Sleeps()); got != "[5s]" {
		t.Errorf("waits = %s, want [5s]", got)
	}
}

func TestWaitRetriesTransientFailuresWithBackoff(t *testing.T) {
	f := newFakeProvider(t)
	s, ft := open(t, f)
	f.polls = []answer{
		errAnswer(http.StatusInternalServerError, "", "boom"),
		dropConnection(),
		errAnswer(http.StatusBadGateway, "", "bad gateway"),
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "20")
			writeJSON(w, http.StatusServiceUnavailable, v1alpha1.Error{Error: "temporarily_unavailable"})
		},
		pending(),
		okAnswer(bindingResponse(t, f.sid)),
	}
	var states []PollState
	var errs []error
	_, err := s.Wait(context.Background(), WithProgress(func(p Progress) {
		states = append(states, p.State)
		errs = append(errs, p.Err)
	}))
	if err != nil {
		t.Fatal(err)
	}
	sl := ft.Sleeps()
	if len(sl) != 5 {
		t.Fatalf("waits = %v, want 5", sl)
	}
	// Backoff doubles from the interval with up to a quarter of jitter off.
	for i, lo := range []time.Duration{1500 * time.Millisecond, 3 * time.Second, 6 * time.Second} {
		hi := lo * 4 / 3
		if sl[i] < lo || sl[i] > hi {
			t.Errorf("wait %d = %s, want in [%s, %s]", i, sl[i], lo, hi)
		}
	}
	if sl[3] != 20*time.Second {
		t.Errorf("wait after 503 with Retry-After 20 = %s", sl[3])
	}
	if sl[4] != 2*time.Second {
		t.Errorf("wait after pending = %s, want the interval", sl[4])
	}
	if fmt.Sprint(states) != "[retrying retrying retrying retrying pending]" {
		t.Errorf("states = %v", states)
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "boom") {
		t.Errorf("first progress error = %v", errs[0])
	}
}

func TestWaitTerminalAnswers(t *testing.T) {
	cases := []struct {
		status int
		code   string
		want   error
	}{
		{http.StatusForbidden, "access_denied", ErrAccessDenied},
		{http.StatusUnauthorized, "invalid_signature", ErrInvalidSignature},
		{http.StatusGone, "expired_token", ErrExpired},
		{http.StatusBadRequest, "invalid_request", ErrInvalidRequest},
		{http.StatusNotFound, "", ErrExpired},
		{http.StatusForbidden, "", ErrInvalidResponse}, // a 403 from something that is not the provider
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status, tc.code), func(t *testing.T) {
			f := newFakeProvider(t)
			s, _ := open(t, f)
			msg := "the provider says: " + tc.code
			f.polls = []answer{pending(), errAnswer(tc.status, tc.code, msg), pending()}
			_, err := s.Wait(context.Background())
			if !errors.Is(err, tc.want) {
				t.Fatalf("Wait = %v, want %v", err, tc.want)
			}
			var se *ServerError
			if !errors.As(err, &se) || se.StatusCode != tc.status || se.Message != msg || !strings.Contains(err.Error(), msg) {
				t.Errorf("error %v does not carry the provider's answer", err)
			}
			if f.polled() != 2 {
				t.Errorf("polled %d times after a terminal answer, want 2", f.polled())
			}
		})
	}
}

func TestWaitValidatesBindingResponse(t *testing.T) {
	cases := map[string]func(br *v1alpha1.BindingResponse){
		"other session": func(br *v1alpha1.BindingResponse) { br.Authentication.OAuth2CodeGrant.SessionID = "other" },
		"no oauth2":     func(br *v1alpha1.BindingResponse) { br.Authentication.OAuth2CodeGrant = nil },
		"apiVersion":    func(br *v1alpha1.BindingResponse) { br.APIVersion = "v1alpha1" },
		"kind":          func(br *v1alpha1.BindingResponse) { br.Kind = "Binding" },
		"request apiVersion": func(br *v1alpha1.BindingResponse) {
			br.Requests = append(br.Requests, json.RawMessage(`{"apiVersion":"v1","kind":"APIServiceExportRequest"}`))
		},
		"request kind": func(br *v1alpha1.BindingResponse) {
			br.Requests = append(br.Requests, json.RawMessage(`{"apiVersion":"kube-bind.io/v1alpha1","kind":"Secret"}`))
		},
		"no kubeconfig":  func(br *v1alpha1.BindingResponse) { br.Kubeconfig = nil },
		"bad kubeconfig": func(br *v1alpha1.BindingResponse) { br.Kubeconfig = []byte("{{{") },
		"no namespace":   func(br *v1alpha1.BindingResponse) { br.Kubeconfig = pollbackend.Kubeconfig(t, "https://x", "") },
		"no server":      func(br *v1alpha1.BindingResponse) { br.Kubeconfig = pollbackend.Kubeconfig(t, "", "ns") },
		"no current context": func(br *v1alpha1.BindingResponse) {
			br.Kubeconfig = bytes.ReplaceAll(br.Kubeconfig, []byte("current-context: provider"), []byte("current-context: gone"))
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFakeProvider(t)
			s, _ := open(t, f)
			br := bindingResponse(t, f.sid)
			mutate(&br)
			f.polls = []answer{okAnswer(br)}
			if _, err := s.Wait(context.Background()); !errors.Is(err, ErrInvalidResponse) {
				t.Fatalf("Wait = %v, want ErrInvalidResponse", err)
			}
		})
	}
}

func TestWaitBoundsTheAnswer(t *testing.T) {
	f := newFakeProvider(t)
	s, _ := open(t, f)
	s.client.MaxBodyBytes = 1 << 10
	f.polls = []answer{okAnswer(map[string]string{"pad": strings.Repeat("x", 2<<10)})}
	if _, err := s.Wait(context.Background()); !errors.Is(err, ErrInvalidResponse) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Wait = %v, want a too-large error", err)
	}
}

// A provider that stays down ends the wait at the session's expiry (plus
// the slack for a completed session's grace period), not never.
func TestWaitGivesUpAfterExpiry(t *testing.T) {
	f := newFakeProvider(t)
	s, ft := open(t, f)
	f.polls = []answer{errAnswer(http.StatusServiceUnavailable, "", "down")}
	_, err := s.Wait(context.Background())
	if !errors.Is(err, ErrExpired) || !strings.Contains(err.Error(), "down") {
		t.Fatalf("Wait = %v, want ErrExpired with the last error", err)
	}
	elapsed := ft.Now().Sub(fakeStart)
	if elapsed < 10*time.Minute || elapsed > 11*time.Minute+2*time.Second {
		t.Errorf("gave up after %s, want 10m plus the 1m slack", elapsed)
	}
}

func TestWaitStopsOnContextCancel(t *testing.T) {
	f := newFakeProvider(t)
	c := New(nil) // real time
	s, err := c.CreateSession(context.Background(), discover(t, c, f), "")
	if err != nil {
		t.Fatal(err)
	}
	f.polls = []answer{pending()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx)
		done <- err
	}()
	for f.polled() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Wait did not return within 1s of the cancel (poll interval is 2s)")
	}

	// A context that ends during a request ends the wait too.
	f.polls = []answer{func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want context.DeadlineExceeded", err)
	}
}

func TestSessionNeverShowsItsSecret(t *testing.T) {
	f := newFakeProvider(t)
	s, _ := open(t, f)
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("session", "s", s)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("session", "s", s)
	out := fmt.Sprintf("%v %+v %#v %s", s, s, s, s) + fmt.Sprintf("%v %+v", *s, []*Session{s}) + logged.String()
	if strings.Contains(out, f.secret) {
		t.Fatalf("the secret shows in %s", out)
	}
	if !strings.Contains(out, f.sid) {
		t.Fatalf("the session ID should show: %s", out)
	}
	u, err := s.AuthenticationURL()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(u, f.secret) {
		t.Fatal("the secret shows in the authentication URL")
	}
}

func TestClusterSecretAndProofInTheAuthenticationURL(t *testing.T) {
	f := newFakeProvider(t)
	const clusterSecret = "cluster-secret-0123456789abcdefghijklmnopqrstu"
	f.create = []answer{func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, v1alpha1.PollSession{
			APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindPollSession,
			SessionID: f.sid, ClusterID: "newcid", SessionSecret: f.secret,
			ExpiresAt: time.Now().Add(10 * time.Minute), ClusterSecret: clusterSecret,
		})
	}}
	s, _ := open(t, f)
	if s.ClusterSecret() != clusterSecret {
		t.Fatalf("ClusterSecret() = %q, want the issued one", s.ClusterSecret())
	}
	if out := fmt.Sprintf("%v %#v", s, s); strings.Contains(out, clusterSecret) {
		t.Fatalf("the cluster secret shows in %s", out)
	}
	raw, err := s.AuthenticationURLWithProof(clusterSecret)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if got, want := q.Get(protocol.ProofParam), protocol.ClusterProof(clusterSecret, f.sid); got != want {
		t.Errorf("cp = %q, want %q", got, want)
	}
	if q.Get("tenant") != "acme" {
		t.Errorf("the authenticatedURL's own query was lost: %s", raw)
	}
	r, err := protocol.RequestFromURL(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !protocol.Verify(f.secret, r, q.Get(protocol.ParamSignature)) {
		t.Error("the URL with the proof does not verify: the signature must cover cp")
	}
	plain, _ := s.AuthenticationURL()
	if strings.Contains(plain, protocol.ProofParam+"=") {
		t.Errorf("AuthenticationURL without a cluster secret carries a proof: %s", plain)
	}
	if got := s.ConfirmationCode(); got != protocol.ConfirmationCode(f.sid) {
		t.Errorf("ConfirmationCode() = %q", got)
	}
}

func TestFetchDocumentOfACallbackOnlyProvider(t *testing.T) {
	f := newFakeProvider(t)
	f.doc = func(base string) v1alpha1.BindingProvider {
		return v1alpha1.BindingProvider{APIVersion: "v1alpha1", Kind: "BindingProvider", Version: "v0.4.8",
			AuthenticationMethods: []v1alpha1.AuthenticationMethod{
				{Method: "Other"},
				{Method: v1alpha1.MethodOAuth2CodeGrant, OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: base + "/authorize"}},
			}}
	}
	c := New(nil)
	doc, err := c.FetchDocument(context.Background(), f.exportURL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ProviderOf(f.exportURL(), *doc); !errors.Is(err, ErrNoPollMethod) {
		t.Errorf("ProviderOf = %v, want ErrNoPollMethod", err)
	}
	u, err := CodeGrantURL(*doc)
	if err != nil || u.String() != f.srv.URL+"/authorize" {
		t.Errorf("CodeGrantURL = %v, %v", u, err)
	}
	doc.AuthenticationMethods = doc.AuthenticationMethods[:1]
	if _, err := CodeGrantURL(*doc); !errors.Is(err, ErrNoCodeGrantMethod) {
		t.Errorf("CodeGrantURL without the method = %v", err)
	}
}
