// Package protocol holds what the kube-bind protocol generations the
// backend serves share: the route type each generation's package lists
// and internal/httpapi mounts.
//
// The generations: internal/protocol/v1alpha2 (the released kubectl-bind
// v0.6–v0.8: /api/*, /exports, the root page, its BindingResponse and the
// CLI token), and v1alpha1, which still lives where it was written
// (internal/httpapi, internal/httpapi/browser, bindservice.RenderV1alpha1)
// until it moves to internal/protocol/v1alpha1. See docs/v1alpha2.md §2.2.
package protocol

import "net/http"

// Route is one route of a generation.
type Route struct {
	Method string
	// Path is the route's path at the host root (the released v0.6+ CLIs
	// call /api/… at the host root, whatever path the external URL has).
	Path    string
	Handler http.HandlerFunc
	// Creates: the route makes something for an anonymous caller (a
	// session, a login state that a callback spends as a single-use
	// mark), so internal/httpapi paces it per client.
	Creates bool
}
