package httpapi

import (
	"container/list"
	"io"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/kbprovider/backend/internal/server/connlimit"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// paceSessions lets h run when the client has a token of the shared
// bucket (Config.SessionCreateRate), else answers 429 slow_down in the
// protocol's JSON with Retry-After.
func (s *server) paceSessions(h http.HandlerFunc) http.HandlerFunc {
	return s.paced(h, func(w http.ResponseWriter, wait time.Duration) {
		s.metrics.sessionsRateLimited.Inc()
		retryAfter(w.Header(), ceilSeconds(wait))
		writeError(w, http.StatusTooManyRequests, v1alpha1.ErrorSlowDown,
			"this client created too many sessions in a short time; wait as long as Retry-After says")
	})
}

// paceLogins is paceSessions for the routes a browser opens that start a
// login or spend its state (a single-use mark in the session store):
// their 429 is a line of text for a person.
func (s *server) paceLogins(h http.HandlerFunc) http.HandlerFunc {
	return s.paced(h, func(w http.ResponseWriter, wait time.Duration) {
		s.metrics.loginsRateLimited.Inc()
		sec := ceilSeconds(wait)
		retryAfter(w.Header(), sec)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "Too many sign-ins from your network in a short time. Try again in "+strconv.FormatInt(sec, 10)+" s.\n")
	})
}

// paced runs h, or refuse when the client has no token. The client is
// the connection's address (connlimit.ClientOf: an IPv4 address, an IPv6
// /64); proxy headers are not trusted (Config.SessionCreateRate).
func (s *server) paced(h http.HandlerFunc, refuse func(http.ResponseWriter, time.Duration)) http.HandlerFunc {
	if s.createLimit == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if wait := s.createLimit.allow(connlimit.ClientOf(r.RemoteAddr), s.cfg.Now()); wait > 0 {
			refuse(w, wait)
			return
		}
		h(w, r)
	}
}

// maxLimitedClients bounds the clients whose pace is
// remembered (a few MB at most); beyond it the least recently seen client
// is forgotten, which gives it a full bucket again.
const maxLimitedClients = 16384

// clientLimiter is a token bucket per client (connlimit.ClientKey), in a
// bounded LRU map.
type clientLimiter struct {
	rate  rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	byKey map[netip.Addr]*list.Element
	lru   list.List // *limiterEntry, most recently used first
}

type limiterEntry struct {
	key netip.Addr
	lim *rate.Limiter
}

// newClientLimiter allows perSecond per client with a burst of three
// seconds' worth (at least 1); nil for perSecond <= 0 (no limit).
func newClientLimiter(perSecond float64, maxClients int) *clientLimiter {
	if perSecond <= 0 {
		return nil
	}
	return &clientLimiter{rate: rate.Limit(perSecond), burst: max(1, int(math.Ceil(3*perSecond))),
		max: maxClients, byKey: map[netip.Addr]*list.Element{}}
}

// allow takes a token of key's bucket at now; when there is none, it
// returns how long until there is one (and takes nothing).
func (c *clientLimiter) allow(key netip.Addr, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lim *rate.Limiter
	if e, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(e)
		lim = e.Value.(*limiterEntry).lim
	} else {
		if c.lru.Len() >= c.max {
			oldest := c.lru.Back()
			delete(c.byKey, c.lru.Remove(oldest).(*limiterEntry).key)
		}
		lim = rate.NewLimiter(c.rate, c.burst)
		c.byKey[key] = c.lru.PushFront(&limiterEntry{key: key, lim: lim})
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

func (c *clientLimiter) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
