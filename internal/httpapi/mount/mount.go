// Package mount is how the parts of the HTTP API put their routes into
// internal/httpapi's router: each protocol generation
// (internal/httpapi/v1alpha1, internal/httpapi/v1alpha2) and the browser
// login (internal/httpapi/browser) is a Part that mounts its own routes,
// and marks those that create something, which the router paces.
package mount

import "net/http"

// Part is a part of the HTTP API.
type Part interface {
	// Mount puts the part's routes into r.
	Mount(r Router)
}

// Router takes a part's routes (implemented by internal/httpapi).
type Router interface {
	Handle(rt Route)
}

// Route is one route of a part.
type Route struct {
	Method string
	// Path is below the external URL's path, or at the host root when
	// AtHostRoot (the released v0.6+ CLIs call /api/… there, whatever
	// path the external URL has). It also labels the route in logs and
	// metrics.
	Path       string
	AtHostRoot bool
	Handler    http.HandlerFunc
	// Creates marks a route that makes something for an anonymous caller
	// (a session, a login state that a callback spends as a single-use
	// mark): the router paces it per client.
	Creates Creates
}

// Creates says what a route creates, and so how a client over its pace
// is answered.
type Creates int

const (
	// CreatesNothing: not paced.
	CreatesNothing Creates = iota
	// CreatesSession: a poll session, for a program: 429 with the
	// protocol's JSON error slow_down.
	CreatesSession
	// CreatesLogin: a login, for a person in a browser: 429 with a line
	// of text.
	CreatesLogin
)

// MethodRefuser is a Part whose routes answer a method they do not take
// with an answer of their own (the browser part: a page); allow is the
// Allow header. Other parts' routes get the API's JSON 405.
type MethodRefuser interface {
	MethodNotAllowed(w http.ResponseWriter, r *http.Request, allow string)
}
