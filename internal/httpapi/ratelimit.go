package httpapi

import (
	"io"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/kbprovider/backend/internal/pace"
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
		if wait := s.createLimit.Allow(connlimit.ClientOf(r.RemoteAddr), s.cfg.Now()); wait > 0 {
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

// newClientLimiter allows perSecond per client (connlimit.ClientKey) with
// a burst of three seconds' worth (at least 1); nil for perSecond <= 0
// (no limit).
func newClientLimiter(perSecond float64, maxClients int) *pace.Limiter[netip.Addr] {
	return pace.New[netip.Addr](perSecond, int(math.Ceil(3*perSecond)), maxClients)
}
