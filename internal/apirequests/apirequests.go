// Package apirequests counts the requests a process makes to a Kubernetes
// API server, by verb and resource, from one transport wrapper on the
// rest.Config every client of the process is built from.
package apirequests

import (
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter counts requests by verb and resource. Safe for concurrent use.
type Counter struct {
	vec *prometheus.CounterVec

	mu     sync.Mutex
	counts map[Key]int64
}

// Key is one label pair of the counter.
type Key struct {
	// Verb is the Kubernetes verb: get, list, watch, create, update,
	// patch, apply, delete, deletecollection; for a path that names no
	// resource (discovery, /version), the lower-case HTTP method.
	Verb string
	// Resource is the resource of the path, with its subresource after a
	// slash ("serviceaccounts/token"); "" for a path that names none. Never
	// a name or a namespace, so that the values stay few.
	Resource string
}

// New returns a Counter whose metric is <namespace>_api_requests_total.
func New(namespace, help string) *Counter {
	return &Counter{
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "api_requests_total", Help: help,
		}, []string{"verb", "resource"}),
		counts: map[Key]int64{},
	}
}

// Describe and Collect make the Counter a prometheus.Collector.
func (c *Counter) Describe(ch chan<- *prometheus.Desc) { c.vec.Describe(ch) }
func (c *Counter) Collect(ch chan<- prometheus.Metric) { c.vec.Collect(ch) }

// Wrap returns rt counting every request it sends (for rest.Config.Wrap).
func (c *Counter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{c: c, next: rt}
}

// Counts is a copy of the counts so far.
func (c *Counter) Counts() map[Key]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Key]int64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

func (c *Counter) add(k Key) {
	c.vec.WithLabelValues(k.Verb, k.Resource).Inc()
	c.mu.Lock()
	c.counts[k]++
	c.mu.Unlock()
}

type roundTripper struct {
	c    *Counter
	next http.RoundTripper
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	t.c.add(Classify(req))
	return t.next.RoundTrip(req)
}

// Classify finds the verb and resource of a request to an API server, as
// the API server's own request info does for its paths.
func Classify(req *http.Request) Key {
	method := strings.ToLower(req.Method)
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return Key{Verb: method}
	}
	watch := req.URL.Query().Get("watch")
	watching := watch == "true" || watch == "1"
	if parts[0] == "watch" {
		watching, parts = true, parts[1:]
	}
	// namespaces/<ns>/<resource>/..., but namespaces/<name>/status and
	// /finalize are the namespace's own subresources.
	if len(parts) > 2 && parts[0] == "namespaces" && parts[2] != "status" && parts[2] != "finalize" {
		parts = parts[2:]
	}
	if len(parts) == 0 || !segment(parts[0]) {
		return Key{Verb: method}
	}
	resource, named := parts[0], len(parts) > 1
	if len(parts) > 2 && segment(parts[2]) {
		resource += "/" + parts[2]
	}
	verb := method
	switch req.Method {
	case http.MethodGet:
		switch {
		case watching:
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
		if strings.HasPrefix(req.Header.Get("Content-Type"), "application/apply-patch") {
			verb = "apply"
		}
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	}
	return Key{Verb: verb, Resource: resource}
}

// segment says whether s can be a resource name (lower-case DNS label
// characters): anything else is not used as a label value.
func segment(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '.' {
			return false
		}
	}
	return true
}
