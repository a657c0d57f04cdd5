package pollclient

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// bindingResponse returns a valid BindingResponse for session sid, with
// the provider's kubeconfig for namespace kube-bind-abc and one request.
func bindingResponse(t testing.TB, sid string) v1alpha1.BindingResponse {
	t.Helper()
	var br v1alpha1.BindingResponse
	if err := json.Unmarshal(pollbackend.BindingResponse(t, sid, "kube-bind-abc", "mangodbs.mangodb.com"), &br); err != nil {
		t.Fatal(err)
	}
	return br
}

// fakeTime replaces the client's clock and sleep: sleeping advances the
// clock at once and records the duration.
type fakeTime struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func installFakeTime(c *Client, start time.Time) *fakeTime {
	ft := &fakeTime{now: start}
	c.now = ft.Now
	c.sleep = ft.Sleep
	return ft
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sleeps = append(f.sleeps, d)
	f.now = f.now.Add(d)
	return nil
}

func (f *fakeTime) Sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}
