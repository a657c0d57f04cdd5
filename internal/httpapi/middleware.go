package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/httpapi/respond"
)

// recorder remembers what a handler answered, for logs and metrics. The
// route label is set by the handler (see named), not derived from the
// path, so that metrics have a bounded set of labels.
type recorder struct {
	http.ResponseWriter
	status      int
	bytes       int64
	route       string
	wroteHeader bool
}

var recorders = sync.Pool{New: func() any { return new(recorder) }}

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader && code >= 200 {
		r.status = code
		r.wroteHeader = true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// Flush lets streaming handlers flush through the recorder.
func (r *recorder) Flush() {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// named labels the route of a handler for logs and metrics.
func named(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*recorder); ok {
			rec.route = route
		}
		h(w, r)
	}
}

// Header values of every answer, assigned to the header map directly
// (never modified afterwards) so that the hot poll path does not allocate
// a slice per header.
var (
	hdrText    = []string{"text/plain; charset=utf-8"}
	hdrNoStore = []string{"no-store"}
	// hdrHSTS pins HTTPS for a year, this host only.
	hdrHSTS = []string{"max-age=31536000"}
)

// routeUnmatched labels requests no route matched.
const routeUnmatched = "unmatched"

// middleware wraps every request: Cache-Control: no-store on every answer
// (and Strict-Transport-Security behind TLS), a bound on request bodies,
// panic recovery, access log and metrics.
func (s *server) middleware(next http.Handler) http.Handler {
	// HSTS when the external URL is https, whatever the request came in
	// over (a TLS-terminating ingress forwards plain http): browsers then
	// refuse to reach this host without TLS. Not includeSubDomains: the
	// provider's other hosts are not ours to pin. Never over plain http,
	// where it would mean nothing and break local use.
	hsts := s.scheme == "https"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := recorders.Get().(*recorder)
		*rec = recorder{ResponseWriter: w, status: http.StatusOK, route: routeUnmatched}
		w.Header()["Cache-Control"] = hdrNoStore
		if hsts {
			w.Header()["Strict-Transport-Security"] = hdrHSTS
		}

		if r.Body != nil && r.Body != http.NoBody {
			if r.ContentLength > maxOtherBody {
				respond.Error(rec, http.StatusRequestEntityTooLarge, respond.ErrRequestTooLarge, respond.TooLargeMessage(maxOtherBody))
				s.finish(rec, r, start)
				return
			}
			r.Body = http.MaxBytesReader(rec, r.Body, maxOtherBody)
		}

		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { //nolint:errorlint // a recovered value, compared as net/http compares it: ErrAbortHandler is panicked as it is
					panic(p)
				}
				s.log.Error("panic while serving a request", "method", r.Method, "path", r.URL.Path,
					"route", rec.route, "panic", p, "stack", string(debug.Stack()))
				if !rec.wroteHeader {
					respond.Error(rec, http.StatusInternalServerError, respond.ErrInternal,
						"the backend failed while answering this request; the failure has been logged")
				} else {
					rec.status = http.StatusInternalServerError
				}
			}
			s.finish(rec, r, start)
		}()
		next.ServeHTTP(rec, r)
	})
}

// finish records metrics and the access log, and recycles rec.
func (s *server) finish(rec *recorder, r *http.Request, start time.Time) {
	d := time.Since(start)
	s.metrics.observe(rec.route, rec.status, d)
	level := accessLogLevel(rec.route, rec.status)
	if s.log.Enabled(r.Context(), level) {
		// Only the path: queries carry signatures and nonces, and bodies
		// and answers carry secrets and kubeconfigs; none are logged.
		s.log.LogAttrs(context.Background(), level, "request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.String("route", rec.route),
			slog.Int("status", rec.status),
			slog.Int64("bytes", rec.bytes),
			slog.Duration("duration", d),
			slog.String("remote", r.RemoteAddr),
		)
	}
	*rec = recorder{}
	recorders.Put(rec)
}

// accessLogLevel keeps routine traffic (probes, scrapes, a client waiting
// for its user) at debug level, so that info logs show what matters, and
// ERROR for what an operator must act on. A 503 is a refusal with
// Retry-After: at the session limit (a flood of clients must not flood the
// log with errors) or while a dependency is away, which its handler logs
// itself at ERROR once per failure and the diagnostics report; so WARN here.
func accessLogLevel(route string, status int) slog.Level {
	switch {
	case status == http.StatusServiceUnavailable:
		return slog.LevelWarn
	case status >= 500:
		return slog.LevelError
	case route == "/healthz" || route == "/readyz":
		return slog.LevelDebug
	case route == PathPoll && (status == http.StatusForbidden || status == http.StatusTooManyRequests):
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// Poll outcomes, the values of the outcome label of polls_total: the error
// codes of a poll (docs/protocol.md) plus "completed", "unavailable"
// (store failure) and "canceled" (the poll ended, its client gone or the
// server stopping, before the store answered: no failure to alert on).
var pollOutcomes = []string{
	"completed", "authorization_pending", "access_denied", "slow_down",
	"invalid_signature", "expired_token", "invalid_request", "request_too_large", "unavailable", "canceled",
}

type metrics struct {
	// sessionsRateLimited counts POST /sessions answered 429.
	sessionsRateLimited prometheus.Counter
	// loginsRateLimited counts login starts and callbacks answered 429.
	loginsRateLimited prometheus.Counter
	polls             map[string]prometheus.Counter
	duration          *prometheus.HistogramVec

	// observers caches resolved histogram children, so that observing a
	// request does not hash label values or allocate.
	mu        sync.RWMutex
	observers map[routeCode]prometheus.Observer
}

type routeCode struct {
	route string
	code  int
}

// counter is one of the backend's counters.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kube_bind_backend", Name: name, Help: help})
}

func newMetrics(reg prometheus.Registerer, lp *longpoll.Holder) (*metrics, error) {
	m := &metrics{
		sessionsRateLimited: counter("sessions_rate_limited_total",
			"POST /sessions and POST /api/sessions answered 429 because their client made too many (--session-create-rate)."),
		loginsRateLimited: counter("logins_rate_limited_total",
			"Login starts (GET /authorize, /api/authorize, /) and callbacks answered 429 because their client made too many requests that create something (--session-create-rate)."),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kube_bind_backend", Name: "http_request_duration_seconds",
			Help:    "Latency of HTTP requests by route and status code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route", "code"}),
		polls:     make(map[string]prometheus.Counter, len(pollOutcomes)),
		observers: make(map[routeCode]prometheus.Observer),
	}
	pollsVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "kube_bind_backend", Name: "polls_total",
		Help: "Polls answered, by outcome (the error code of the answer, or completed).",
	}, []string{"outcome"})
	for _, o := range pollOutcomes {
		m.polls[o] = pollsVec.WithLabelValues(o)
	}
	collectors := []prometheus.Collector{m.sessionsRateLimited, m.loginsRateLimited, pollsVec, m.duration}
	if lp != nil {
		collectors = append(collectors,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "kube_bind_backend", Name: "long_polls_held",
				Help: "Polls held open now, waiting for their session to end (Prefer: wait).",
			}, func() float64 { return float64(lp.Held()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "kube_bind_backend", Name: "long_polls_refused_total",
				Help: "Polls that asked to wait but were answered at once: --max-long-polls were held already.",
			}, func() float64 { return float64(lp.Refused()) }))
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) poll(outcome string) { m.polls[outcome].Inc() }

func (m *metrics) observe(route string, code int, d time.Duration) {
	k := routeCode{route, code}
	m.mu.RLock()
	o := m.observers[k]
	m.mu.RUnlock()
	if o == nil {
		o = m.duration.WithLabelValues(route, strconv.Itoa(code))
		m.mu.Lock()
		m.observers[k] = o
		m.mu.Unlock()
	}
	o.Observe(d.Seconds())
}
