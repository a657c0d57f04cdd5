package httpapi

import "net/http"

// Route is one route a protocol generation's package (internal/httpapi/v1alpha2)
// lists for the router to mount at the host root.
type Route struct {
	Method string
	// Path is the route's path at the host root (the released v0.6+ CLIs
	// call /api/… at the host root, whatever path the external URL has).
	Path    string
	Handler http.HandlerFunc
	// Creates: the route makes something for an anonymous caller (a
	// session, a login state that a callback spends as a single-use
	// mark), so the router paces it per client.
	Creates bool
}
