package clockskew

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A real HTTP server's Date header against clocks off by known amounts:
// the offset measured is within the documented 1 s, and only an offset
// past Bound is warned about.
func TestOffsetFromDate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	for _, skew := range []time.Duration{0, 1500 * time.Millisecond, -1500 * time.Millisecond, 7 * time.Second, -7 * time.Second} {
		var logs bytes.Buffer
		m := New(func() time.Time { return time.Now().Add(skew) }, slog.New(slog.NewTextHandler(&logs, nil)))
		client := &http.Client{Transport: m.Wrap(http.DefaultTransport)}
		if _, ok := m.Offset(); ok {
			t.Fatal("an offset before any answer")
		}
		res, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		off, ok := m.Offset()
		if !ok {
			t.Fatalf("skew %s: no offset measured", skew)
		}
		// Our clock is skew ahead: the server's minus ours is -skew.
		if d := off + skew; d.Abs() > time.Second {
			t.Errorf("skew %s: measured offset %s, more than 1 s off", skew, off)
		}
		warned := strings.Contains(logs.String(), "disagrees")
		if want := skew.Abs() > Bound; warned != want {
			t.Errorf("skew %s: warned %v, want %v (log %q)", skew, warned, want, logs.String())
		}
	}
}

// Answers without a usable Date, or too slow to tell, change nothing.
func TestObserveIgnores(t *testing.T) {
	m := New(nil, slog.New(slog.DiscardHandler))
	now := time.Now()
	for _, c := range []struct {
		date           string
		sent, received time.Time
	}{
		{"", now, now},
		{"yesterday", now, now},
		{now.UTC().Format(http.TimeFormat), now, now.Add(2 * time.Second)},
		{now.UTC().Format(http.TimeFormat), now, now.Add(-time.Second)},
	} {
		m.Observe(c.date, c.sent, c.received)
		if _, ok := m.Offset(); ok {
			t.Fatalf("measured from %+v", c)
		}
	}
}
