package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/testutil/procs"
)

// flakyStore answers ErrUnavailable (a replica slow or restarting) while
// down is set, like the hashring does for a session whose holder does not
// answer.
type flakyStore struct {
	sessions.Store
	down atomic.Bool
}

func (f *flakyStore) err() error {
	if f.down.Load() {
		return fmt.Errorf("%w: the replica holding this session did not answer", sessions.ErrUnavailable)
	}
	return nil
}

func (f *flakyStore) Create(ctx context.Context, s sessions.Session) error {
	if err := f.err(); err != nil {
		return err
	}
	return f.Store.Create(ctx, s)
}

func (f *flakyStore) Get(ctx context.Context, id string) (sessions.Session, error) {
	if err := f.err(); err != nil {
		return sessions.Session{}, err
	}
	return f.Store.Get(ctx, id)
}

// Static and RecordPoll are what a poll asks the store (one hop on a
// hashring): both fail while down.
func (f *flakyStore) Static(ctx context.Context, id string) (sessions.Session, error) {
	if err := f.err(); err != nil {
		return sessions.Session{}, err
	}
	return f.Store.Static(ctx, id)
}

func (f *flakyStore) RecordPoll(ctx context.Context, id, nonce string, d time.Duration) (sessions.Session, error) {
	if err := f.err(); err != nil {
		return sessions.Session{}, err
	}
	return f.Store.RecordPoll(ctx, id, nonce, d)
}

// A store that is briefly unavailable is 503 with Retry-After, logged as a
// warning, for creating and for polling: never 410 (the session is not
// lost), never an ERROR.
func TestUnavailableStoreIs503(t *testing.T) {
	e := newEnv(t, envOpts{ttl: time.Minute})
	flaky := &flakyStore{Store: e.store}
	logs := &procs.Buffer{}
	h, err := New(Config{ClusterKey: e.key, ExternalURL: e.ext, PrettyName: "x", SessionTTL: time.Minute,
		Store: flaky, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	record := func(method, target string) *httptest.ResponseRecorder {
		r := httptest.NewRecorder()
		h.ServeHTTP(r, httptest.NewRequest(method, target, nil))
		return r
	}
	ps := e.createSession("")
	flaky.down.Store(true)
	for name, target := range map[string][2]string{
		"poll":   {"GET", e.pollURL(ps)},
		"create": {"POST", e.ext.String() + "/sessions"},
	} {
		r := record(target[0], target[1])
		if r.Code != 503 || r.Header().Get("Retry-After") == "" || !strings.Contains(r.Body.String(), "temporarily_unavailable") {
			t.Errorf("%s while the store is unavailable: %d %q %s", name, r.Code, r.Header().Get("Retry-After"), r.Body)
		}
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("an unavailable store was logged as an error:\n%s", logs)
	}
	flaky.down.Store(false)
	if r := record("GET", e.pollURL(ps)); r.Code != 403 {
		t.Errorf("poll once the store is back: %d, want 403 pending: %s", r.Code, r.Body)
	}
}
