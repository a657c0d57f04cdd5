package heartbeats

import (
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// A heartbeat stays healthy exactly up to 2 x interval + slack and turns
// HeartbeatMissing the moment after; the verdict says when that moment is.
func TestStalenessFollowsTheClock(t *testing.T) {
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakeClock(start)
	hb := Heartbeat{Last: start, Interval: time.Minute}

	v := Evaluate(hb, clock.Now(), 30*time.Second)
	if !v.Healthy || v.Reason != ReasonHeartbeatRecent || v.Severity != "" {
		t.Fatalf("fresh heartbeat: %+v", v)
	}
	if want := start.Add(2*time.Minute + 30*time.Second); !v.StaleAt.Equal(want) {
		t.Fatalf("StaleAt %s, want %s", v.StaleAt, want)
	}

	clock.Step(2*time.Minute + 30*time.Second) // exactly at the limit
	if v := Evaluate(hb, clock.Now(), 30*time.Second); !v.Healthy {
		t.Fatalf("at the limit: %+v, want still healthy", v)
	}
	clock.Step(time.Millisecond)
	v = Evaluate(hb, clock.Now(), 30*time.Second)
	if v.Healthy || v.Reason != ReasonHeartbeatMissing || v.Severity != SeverityWarning || !v.StaleAt.IsZero() {
		t.Fatalf("just past the limit: %+v, want HeartbeatMissing", v)
	}
	if !strings.Contains(v.Message, "2025-03-01T12:00:00Z") || !strings.Contains(v.Message, "2m30s") {
		t.Errorf("message %q should name the last heartbeat and the tolerance", v.Message)
	}
	// The message does not depend on the time it is evaluated at, so a
	// stale binding is not rewritten on every pass.
	clock.Step(time.Hour)
	if again := Evaluate(hb, clock.Now(), 30*time.Second); again != v {
		t.Errorf("verdict changed while staying stale: %+v then %+v", v, again)
	}

	// A new heartbeat makes it healthy again.
	hb.Last = clock.Now()
	if v := Evaluate(hb, clock.Now(), 30*time.Second); !v.Healthy {
		t.Errorf("after a new heartbeat: %+v", v)
	}
}

func TestNoHeartbeatAndIntervals(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	if v := Evaluate(Heartbeat{}, now, DefaultSlack); v.Healthy || v.Reason != ReasonNoHeartbeat || v.Severity != SeverityInfo {
		t.Errorf("no heartbeat: %+v", v)
	}
	for _, c := range []struct {
		interval, want time.Duration
	}{
		{0, 2*DefaultInterval + DefaultSlack},            // missing: the konnector's default
		{-time.Second, 2*DefaultInterval + DefaultSlack}, // nonsense
		{10 * time.Second, 20*time.Second + DefaultSlack},
		{1000 * time.Hour, 2*MaxInterval + DefaultSlack}, // capped
	} {
		if got := Tolerance(c.interval, DefaultSlack); got != c.want {
			t.Errorf("Tolerance(%s) = %s, want %s", c.interval, got, c.want)
		}
	}
	// A heartbeat from a clock ahead of ours is recent, not an error.
	if v := Evaluate(Heartbeat{Last: now.Add(time.Minute), Interval: time.Minute}, now, DefaultSlack); !v.Healthy {
		t.Errorf("future heartbeat: %+v", v)
	}
}

func TestParseHeartbeat(t *testing.T) {
	obj := map[string]any{"status": map[string]any{
		"lastHeartbeatTime": "2025-03-01T12:00:00Z",
		"heartbeatInterval": "5m0s",
	}}
	hb := heartbeatOf(obj)
	if !hb.Last.Equal(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)) || hb.Interval != 5*time.Minute {
		t.Errorf("parsed %+v", hb)
	}
	for _, status := range []map[string]any{
		{},
		{"lastHeartbeatTime": "yesterday", "heartbeatInterval": "often"},
		{"lastHeartbeatTime": int64(3), "heartbeatInterval": []any{}},
	} {
		if hb := heartbeatOf(map[string]any{"status": status}); !hb.Last.IsZero() || hb.Interval != 0 {
			t.Errorf("%v parsed as %+v, want nothing", status, hb)
		}
	}
}
