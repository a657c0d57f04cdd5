package httpapi

import (
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/kbprovider/backend/internal/httpapi/respond"
	"github.com/kbprovider/backend/internal/server/health"
)

// pathExport is where the 404 points: v1alpha1's discovery, below the
// external URL's path.
const pathExport = "/export"

// readinessTimeout bounds each readiness check; they read this replica's
// own state only.
const readinessTimeout = time.Second

// healthz says the process is alive and serving; it checks nothing else,
// so that a dependency that is down never gets the pod restarted.
func (s *server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header()["Content-Type"] = hdrText
	w.Write([]byte("ok\n"))
}

// readyz answers 200 "ok" while every readiness check holds, else 503
// "not ready", and nothing more: this is the public listener, for load
// balancers that health-check the port they send traffic to. Which check
// failed and why is on the diagnostics listener only.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	for _, res := range health.Run(r.Context(), s.cfg.Readiness, readinessTimeout) {
		if res.Err != nil {
			w.Header()["Content-Type"] = hdrText
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready\n"))
			return
		}
	}
	w.Header()["Content-Type"] = hdrText
	w.Write([]byte("ok\n"))
}

func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	respond.Error(w, http.StatusNotFound, respond.ErrNotFound, "there is nothing at "+r.URL.Path+"; discovery is at "+pathExport)
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
		if ref, ok := s.refusers[r.URL.Path]; ok {
			if rec, ok := w.(*recorder); ok {
				rec.route = ref.route
			}
			ref.answer.MethodNotAllowed(w, r, allow)
			return
		}
		w.Header().Set("Allow", allow)
		respond.Error(w, http.StatusMethodNotAllowed, respond.ErrMethodNotAllowed,
			r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow)
	}
}
