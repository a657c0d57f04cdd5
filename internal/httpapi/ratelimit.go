package httpapi

import (
	"io"
	"math"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/respond"
	"github.com/kbprovider/backend/internal/pace"
	"github.com/kbprovider/backend/internal/server/connlimit"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// paced lets h run when the client has a token of the shared bucket
// (Config.SessionCreateRate) or h creates nothing; else it answers 429
// with Retry-After, in the form of the route's answers: the protocol's
// JSON slow_down for a session, a line of text for a person's login.
// The client is the connection's address (connlimit.ClientOf: an IPv4
// address, an IPv6 /64); proxy headers are not trusted.
func (s *server) paced(h http.HandlerFunc, c mount.Creates) http.HandlerFunc {
	if s.createLimit == nil || c == mount.CreatesNothing {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		wait := s.createLimit.Allow(connlimit.ClientOf(r.RemoteAddr), s.cfg.Now())
		if wait <= 0 {
			h(w, r)
			return
		}
		sec := respond.CeilSeconds(wait)
		respond.RetryAfter(w.Header(), sec)
		if c == mount.CreatesSession {
			s.metrics.sessionsRateLimited.Inc()
			respond.Error(w, http.StatusTooManyRequests, v1alpha1.ErrorSlowDown,
				"this client created too many sessions in a short time; wait as long as Retry-After says")
			return
		}
		s.metrics.loginsRateLimited.Inc()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "Too many sign-ins from your network in a short time. Try again in "+strconv.FormatInt(sec, 10)+" s.\n")
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
