package pollclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/fakes"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
	"github.com/kbprovider/backend/pkg/protocol"
)

// These tests run the client against the backend's real router and real
// in-memory store. The test plays the user in the browser by completing or
// denying the session with pollbackend's Complete and Deny, which record
// the outcome as a bind or a cancel in the browser does.

func openSession(t *testing.T, b *pollbackend.Backend, clusterID string) *pollclient.Session {
	t.Helper()
	c := pollclient.New(b.Server.Client())
	p, err := c.Discover(context.Background(), b.ExportURL)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(context.Background(), p, clusterID)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitAsync runs Wait in the background and reports each pending poll.
func waitAsync(ctx context.Context, s *pollclient.Session) (pending <-chan pollclient.Progress, done <-chan waitResult) {
	pc := make(chan pollclient.Progress, 100)
	dc := make(chan waitResult, 1)
	go func() {
		res, err := s.Wait(ctx, pollclient.WithProgress(func(p pollclient.Progress) {
			select {
			case pc <- p:
			default:
			}
		}))
		dc <- waitResult{res, err}
	}()
	return pc, dc
}

type waitResult struct {
	res *pollclient.Result
	err error
}

func await(t *testing.T, done <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return within 30s")
		return waitResult{}
	}
}

func TestEndToEndCompletedSession(t *testing.T) {
	for _, prefix := range []string{"", "/bind/v1"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			b := pollbackend.Start(t, pollbackend.Options{Prefix: prefix})
			s := openSession(t, b, "")
			opened, err := b.Sessions.Open(s.ID)
			if err != nil {
				t.Fatal(err)
			}
			// No cluster ID was presented, so the ID carries none; the
			// one issued is derived from the session ID.
			issued, proven := b.Sessions.SettleCluster(opened, "")
			if opened.ClusterID != "" || proven || s.ClusterID != issued || !protocol.IssuedClusterID(s.ClusterID) {
				t.Errorf("cluster ID %q, the backend issued %q (presented %q)", s.ClusterID, issued, opened.ClusterID)
			}
			if !s.ExpiresAt.Equal(opened.ExpiresAt) {
				t.Errorf("expiresAt %s, the session ID says %s", s.ExpiresAt, opened.ExpiresAt)
			}

			// The authentication URL is signed for the backend's external
			// URL with the session's secret; the backend would accept it.
			authURL, err := s.AuthenticationURL()
			if err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(authURL)
			if !strings.HasPrefix(authURL, b.URL+"/authorize?") || u.Query().Get("s") != s.ID {
				t.Errorf("authentication URL %s", authURL)
			}
			r, _ := protocol.RequestFromURL("GET", u, nil)
			if !protocol.Verify(opened.Secret, r, u.Query().Get("h")) {
				t.Errorf("authentication URL %s does not verify with the session's secret", authURL)
			}

			pending, done := waitAsync(context.Background(), s)
			for i := 0; i < 2; i++ { // two pending polls: the interval is kept
				if p := <-pending; p.State != pollclient.StatePending || p.StatusCode != http.StatusForbidden {
					t.Fatalf("progress %+v, want pending", p)
				}
			}
			want := pollbackend.BindingResponse(t, s.ID, "kube-bind-e2e", "mangodbs.mangodb.com", "widgets.example.org")
			if err := b.Complete(s.ID, want); err != nil {
				t.Fatal(err)
			}
			got := await(t, done)
			if got.err != nil {
				t.Fatal(got.err)
			}
			if !bytes.Equal(got.res.Raw, want) {
				t.Errorf("raw answer\n%s\nwant exactly\n%s", got.res.Raw, want)
			}
			var wantBR v1alpha1.BindingResponse
			if err := json.Unmarshal(want, &wantBR); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.res.Response, wantBR) {
				t.Errorf("response %+v, want %+v", got.res.Response, wantBR)
			}
			if got.res.Namespace != "kube-bind-e2e" || got.res.Server != "https://provider.example:6443" || len(got.res.Response.Requests) != 2 {
				t.Errorf("result namespace %q server %q requests %d", got.res.Namespace, got.res.Server, len(got.res.Response.Requests))
			}
		})
	}
}

// After the first 200 the same response stays available for the grace
// period; after it, polls get 410.
func TestEndToEndGracePeriodThenGone(t *testing.T) {
	grace := 45 * time.Second
	b := pollbackend.Start(t, pollbackend.Options{Limits: sessions.Limits{Grace: grace}})
	s := openSession(t, b, "")
	want := pollbackend.BindingResponse(t, s.ID, "ns-grace", "mangodbs.mangodb.com")
	if err := b.Complete(s.ID, want); err != nil {
		t.Fatal(err)
	}
	first, err := s.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A client whose answer was lost polls again within the grace period.
	b.Clock.Advance(grace - 5*time.Second)
	again, err := s.Wait(context.Background())
	if err != nil {
		t.Fatalf("poll within the grace period: %v", err)
	}
	if !bytes.Equal(first.Raw, want) || !bytes.Equal(again.Raw, want) {
		t.Errorf("answers differ from the stored response:\n%s\n%s", first.Raw, again.Raw)
	}
	b.Clock.Advance(10 * time.Second)
	_, err = s.Wait(context.Background())
	var se *pollclient.ServerError
	if !errors.Is(err, pollclient.ErrExpired) || !errors.As(err, &se) || se.StatusCode != http.StatusGone || se.Code != v1alpha1.ErrorExpiredToken {
		t.Fatalf("poll after the grace period = %v, want 410 expired_token", err)
	}
}

func TestEndToEndDenied(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	s := openSession(t, b, "")
	pending, done := waitAsync(context.Background(), s)
	<-pending
	if err := b.Deny(s.ID, "alice is not in group binders"); err != nil {
		t.Fatal(err)
	}
	got := await(t, done)
	var se *pollclient.ServerError
	if !errors.Is(got.err, pollclient.ErrAccessDenied) || !errors.As(got.err, &se) || se.StatusCode != http.StatusForbidden ||
		!strings.Contains(se.Message, "alice is not in group binders") {
		t.Fatalf("Wait = %v, want access denied with the reason", got.err)
	}
}

func TestEndToEndExpiredWhilePending(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{SessionTTL: 10 * time.Minute})
	s := openSession(t, b, "")
	pending, done := waitAsync(context.Background(), s)
	<-pending
	b.Clock.Advance(10*time.Minute + time.Second)
	got := await(t, done)
	if !errors.Is(got.err, pollclient.ErrExpired) {
		t.Fatalf("Wait = %v, want ErrExpired", got.err)
	}
}

// A client presenting the cluster ID of an earlier binding keeps it; one
// the backend does not accept is replaced by a new one.
func TestEndToEndPresentsClusterID(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	first := openSession(t, b, "")
	again := openSession(t, b, first.ClusterID)
	if again.ClusterID != first.ClusterID || again.ID == first.ID {
		t.Errorf("second session: cluster ID %q (want %q), session %q (first %q)", again.ClusterID, first.ClusterID, again.ID, first.ID)
	}
	cli := openSession(t, b, "aB3xY9") // a released CLI's format
	if cli.ClusterID != "aB3xY9" {
		t.Errorf("CLI cluster ID not kept: %q", cli.ClusterID)
	}
	other := openSession(t, b, "not a cluster id!")
	if other.ClusterID == "not a cluster id!" || !protocol.IssuedClusterID(other.ClusterID) {
		t.Errorf("malformed cluster ID kept or badly replaced: %q", other.ClusterID)
	}
}

// Two clients polling one session at once make the real router answer 429
// with Retry-After; the client waits and both get the response.
func TestEndToEndSlowDown(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{PollInterval: time.Second})
	s := openSession(t, b, "")
	var mu sync.Mutex
	var slowDowns []pollclient.Progress
	record := pollclient.WithProgress(func(p pollclient.Progress) {
		if p.State == pollclient.StateSlowDown {
			mu.Lock()
			slowDowns = append(slowDowns, p)
			mu.Unlock()
		}
	})
	want := pollbackend.BindingResponse(t, s.ID, "ns", "mangodbs.mangodb.com")
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			res, err := s.Wait(context.Background(), record)
			if err == nil && !bytes.Equal(res.Raw, want) {
				err = errors.New("wrong response")
			}
			errs <- err
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	if err := b.Complete(s.ID, want); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(slowDowns) == 0 {
		t.Fatal("no 429 seen although two clients polled one session at once")
	}
	for _, p := range slowDowns {
		if p.StatusCode != http.StatusTooManyRequests || p.Wait < time.Second || p.Wait > 2*time.Second {
			t.Errorf("slow down %+v: want a 429 and a wait of the Retry-After (1-2s)", p)
		}
	}
}

// A session is derived, not stored, so creating one never fails for want
// of room; what can fail is the store a poll asks for the outcome. Then the
// real router answers 503 with Retry-After; the client waits for it, and
// gives up when its context ends.
func TestEndToEndStoreUnavailable(t *testing.T) {
	store := &fakes.FlakyStore{Only: map[string]bool{"Outcome": true}}
	store.Down(sessions.ErrUnavailable)
	b := pollbackend.Start(t, pollbackend.Options{PollInterval: 100 * time.Millisecond,
		Wrap: func(s sessions.Store) sessions.Store { store.Store = s; return store }})
	c := pollclient.New(b.Server.Client())
	p, err := c.Discover(context.Background(), b.ExportURL)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(context.Background(), p, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var progress []pollclient.Progress
	start := time.Now()
	_, err = s.Wait(ctx, pollclient.WithProgress(func(p pollclient.Progress) { progress = append(progress, p) }))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on an unavailable store = %v, want to wait for Retry-After until the context ended", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait took %s after its context ended", d)
	}
	if len(progress) != 1 || progress[0].State != pollclient.StateRetrying ||
		progress[0].StatusCode != http.StatusServiceUnavailable || progress[0].Wait < 5*time.Second {
		t.Errorf("progress %+v, want one 503 followed by a wait of its Retry-After (5s)", progress)
	}
}

// With long polling on, the client's first poll is held by the real
// backend and answered when the session completes: no second poll.
func TestEndToEndLongPoll(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{LongPollMaxWait: 30 * time.Second, PollInterval: time.Second})
	s := openSession(t, b, "")
	pending, done := waitAsync(context.Background(), s)
	time.Sleep(500 * time.Millisecond) // the first poll is held by now
	start := time.Now()
	if err := b.Complete(s.ID, pollbackend.BindingResponse(t, s.ID, "kube-bind-abc")); err != nil {
		t.Fatal(err)
	}
	r := await(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Namespace != "kube-bind-abc" {
		t.Fatalf("result %+v", r.res)
	}
	select {
	case p := <-pending:
		t.Fatalf("a poll was answered before the session completed: %+v", p)
	default:
	}
	t.Logf("the held poll answered %s after Complete", time.Since(start))
	if outcomes, deliveries, _ := b.Store.Len(); outcomes != 1 || deliveries != 1 {
		t.Fatalf("after the held poll the store holds %d outcomes and %d deliveries, want the one delivered response", outcomes, deliveries)
	}
}
