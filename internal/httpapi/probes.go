package httpapi

import (
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/kbprovider/backend/internal/health"
)

// readinessTimeout bounds each readiness check.
const readinessTimeout = 3 * time.Second

// healthz says the process is alive and serving; it checks nothing else,
// so that a dependency that is down never gets the pod restarted.
func (s *server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header()["Content-Type"] = hdrText
	w.Write([]byte("ok\n"))
}

// readyz runs every readiness check and lists each one's state:
//
//	[+]oidc ok
//	[-]cluster failed: ...
//
// 200 when all pass, 503 otherwise.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	results := health.Run(r.Context(), s.cfg.Readiness, readinessTimeout)
	var b strings.Builder
	status := http.StatusOK
	for _, res := range results {
		if res.Err != nil {
			status = http.StatusServiceUnavailable
			b.WriteString("[-]" + res.Name + " failed: " + oneLine(res.Err.Error()) + "\n")
		} else {
			b.WriteString("[+]" + res.Name + " ok\n")
		}
	}
	if status == http.StatusOK {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready\n")
	}
	w.Header()["Content-Type"] = hdrText
	w.WriteHeader(status)
	w.Write([]byte(b.String()))
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, errNotFound, "there is nothing at "+r.URL.Path+"; discovery is at "+PathExport)
}

// methodNotAllowed answers 405 with the Allow header, found by asking the
// router which methods match the path: a browser route with the browser's
// page, every other route with a JSON error.
func (s *server) methodNotAllowed(routes chi.Routes) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
			http.MethodPatch, http.MethodDelete, http.MethodOptions} {
			if routes.Match(chi.NewRouteContext(), m, r.URL.Path) {
				allowed = append(allowed, m)
			}
		}
		allow := strings.Join(allowed, ", ")
		if route, ok := s.browserPaths[r.URL.Path]; ok {
			if rec, ok := w.(*recorder); ok {
				rec.route = route
			}
			s.cfg.Browser.MethodNotAllowed(w, r, allow)
			return
		}
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, errMethodNotAllowed,
			r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow)
	}
}

// browserMissing answers /authorize while no browser flow is configured.
func (s *server) browserMissing(w http.ResponseWriter, _ *http.Request) {
	w.Header()["Content-Type"] = hdrText
	w.Header()[retryAfterKy] = hdrRetry30
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte("The sign-in page of this provider is not available: the backend runs without its browser login.\n" +
		"Ask the provider's operator to configure it, then run your bind command again.\n"))
}
