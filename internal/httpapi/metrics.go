package httpapi

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/longpoll"
)

// Poll outcomes, the values of the outcome label of polls_total: the error
// codes of §4 plus "completed" and "unavailable" (store failure).
var pollOutcomes = []string{
	"completed", "authorization_pending", "access_denied", "slow_down",
	"invalid_signature", "expired_token", "invalid_request", "request_too_large", "unavailable",
}

type metrics struct {
	sessionsCreated prometheus.Counter
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

func newMetrics(reg prometheus.Registerer, lp *longpoll.Holder) (*metrics, error) {
	m := &metrics{
		sessionsCreated: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kube_bind_backend", Name: "sessions_created_total",
			Help: "Poll sessions created.",
		}),
		sessionsRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kube_bind_backend", Name: "sessions_rate_limited_total",
			Help: "POST /sessions and POST /api/sessions answered 429 because their client made too many (--session-create-rate).",
		}),
		loginsRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kube_bind_backend", Name: "logins_rate_limited_total",
			Help: "Login starts (GET /authorize, /api/authorize, /) and callbacks answered 429 because their client made too many requests that create something (--session-create-rate).",
		}),
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
	collectors := []prometheus.Collector{m.sessionsCreated, m.sessionsRateLimited, m.loginsRateLimited, pollsVec, m.duration}
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
