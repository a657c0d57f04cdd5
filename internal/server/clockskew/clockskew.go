// Package clockskew measures how far this replica's clock is from the
// provider cluster's API server's, from the Date header of the answers the
// replica gets anyway (the dependency monitor reads /version every 10 s),
// and warns when it is past Bound (docs/sessions.md says what skew does).
package clockskew

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// Bound is the offset past which a replica warns. The rules that compare
// times written by one replica with another's clock (expiry, grace,
// collection) hold while replicas disagree by less than the grace period
// (60 s); two replicas within Bound of the API server are within 2×Bound
// of each other, a sixth of it. A clock kept by NTP is within
// milliseconds: past Bound it is broken, not drifting.
const Bound = 5 * time.Second

// maxRoundTrip: an answer that took longer says too little about when
// the API server wrote its Date.
const maxRoundTrip = time.Second

// warnEvery spaces the warnings while the offset stays past Bound.
const warnEvery = time.Minute

// Monitor keeps the last offset measured. Safe for concurrent use.
type Monitor struct {
	now      func() time.Time
	log      *slog.Logger
	offset   atomic.Int64 // nanoseconds, the API server's clock minus ours
	measured atomic.Bool
	lastWarn atomic.Int64 // UnixNano, our clock
}

// New returns a Monitor of the clock now (nil: time.Now) logging to log.
func New(now func() time.Time, log *slog.Logger) *Monitor {
	if now == nil {
		now = time.Now
	}
	return &Monitor{now: now, log: log}
}

// Wrap returns rt measuring the offset from each answer's Date header
// (for rest.Config.Wrap).
func (m *Monitor) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{m: m, next: rt}
}

type roundTripper struct {
	m    *Monitor
	next http.RoundTripper
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := t.m.now()
	res, err := t.next.RoundTrip(req)
	if err == nil {
		t.m.Observe(res.Header.Get("Date"), sent, t.m.now())
	}
	return res, err
}

// Observe takes one answer's Date header, sent and received on this
// replica's clock. The API server wrote Date between the two, truncated
// to the second, so the offset is known within half a second plus half
// the round trip: within 1 s, as answers slower than maxRoundTrip are
// not used.
func (m *Monitor) Observe(date string, sent, received time.Time) {
	rtt := received.Sub(sent)
	if date == "" || rtt < 0 || rtt > maxRoundTrip {
		return
	}
	at, err := http.ParseTime(date)
	if err != nil {
		return
	}
	off := at.Add(500 * time.Millisecond).Sub(sent.Add(rtt / 2))
	m.offset.Store(int64(off))
	m.measured.Store(true)
	if off.Abs() <= Bound {
		return
	}
	now, last := received.UnixNano(), m.lastWarn.Load()
	if (now-last >= int64(warnEvery) || now < last) && m.lastWarn.CompareAndSwap(last, now) {
		m.log.Warn("this replica's clock disagrees with the provider cluster's API server by more than "+Bound.String()+
			"; session expiry, grace periods and record collection are judged on it (docs/sessions.md)",
			"skew", (-off).Round(100*time.Millisecond).String(), "api_server_minus_local_seconds", off.Seconds())
	}
}

// Offset returns the last offset measured, the API server's clock minus
// this replica's (within 1 s), and whether one was.
func (m *Monitor) Offset() (time.Duration, bool) {
	return time.Duration(m.offset.Load()), m.measured.Load()
}
