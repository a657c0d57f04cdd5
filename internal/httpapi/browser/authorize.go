package browser

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/protocol"
)

// authorize is where the link the CLI printed lands. The poll flow's link
// is signed (s, n, h); the callback flow's names the CLI's callback (p or
// u) with its session and cluster IDs (s, c).
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		h.page(w, http.StatusBadRequest, pageBadLink, "the link's query does not parse")
		return
	}
	switch {
	case q.Has(protocol.ParamSignature) || q.Has(protocol.ParamNonce):
		h.authorizePoll(w, r, q)
	case q.Has("p") || q.Has("u"):
		if h.cfg.NoCallbackFlow {
			// Before any login, creating nothing; HEAD gets the same.
			h.RefuseCallbackFlow(w)
			return
		}
		h.authorizeCallback(w, r, q)
	default:
		h.page(w, http.StatusBadRequest, pageBadLink, "the link has neither a signature nor a callback")
	}
}

func (h *Handler) authorizePoll(w http.ResponseWriter, r *http.Request, q url.Values) {
	sid, okS := protocol.Single(q, protocol.ParamSession)
	nonce, okN := protocol.Single(q, protocol.ParamNonce)
	sig, okH := protocol.Single(q, protocol.ParamSignature)
	if !okS || !okN || !okH || !protocol.URLSafe(sid, 128) || !protocol.URLSafe(nonce, 128) {
		h.page(w, http.StatusBadRequest, pageBadLink, "s, n and h must each appear once")
		return
	}
	sess, err := h.svc.Open(sid)
	switch {
	case errors.Is(err, lifecycle.ErrExpired):
		h.page(w, http.StatusGone, pageExpired, "")
		return
	case err != nil || !sess.Flow.Polled():
		h.page(w, http.StatusNotFound, pageUnknownSession, "")
		return
	}
	signed := protocol.Request{
		Scheme: h.cfg.ExternalURL.Scheme, Host: h.cfg.ExternalURL.Host,
		Method: http.MethodGet, Path: r.URL.EscapedPath(), Query: q,
	}
	if !protocol.Verify(sess.Secret, signed, sig) {
		h.page(w, http.StatusUnauthorized, pageBadSignature, "")
		return
	}
	ctx := r.Context()
	if !h.stillPending(ctx, w, sess) {
		return
	}
	if r.Method == http.MethodHead {
		// A link preview or scanner: what a GET would say, without the
		// login it would begin.
		linkLooksGood(w)
		return
	}
	// The link's nonce travels in the login state and is spent at the
	// callback once the user signed in (Handler.callback): opening a link
	// writes nothing, so a stranger who made a session and its link
	// costs the provider cluster no record.
	clusterID, kind := h.pollCluster(sess, q)
	h.beginLogin(w, r, flow{SessionID: sess.ID, ClusterID: clusterID, ClusterKind: kind, LinkNonce: nonce}.encode())
}

func (h *Handler) authorizeCallback(w http.ResponseWriter, r *http.Request, q url.Values) {
	callback, problem := h.callbackURL(q)
	if problem != "" {
		h.page(w, http.StatusBadRequest, pageBadCallback, problem)
		return
	}
	cliSession, okS := protocol.Single(q, "s")
	clusterID, okC := protocol.Single(q, "c")
	if !okS || !protocol.URLSafe(cliSession, 64) {
		h.page(w, http.StatusBadRequest, pageBadLink, "s must be the CLI's session ID, once")
		return
	}
	if !okC || !protocol.ValidClusterID(clusterID) {
		h.page(w, http.StatusBadRequest, pageBadLink, "c must be a cluster ID, once")
		return
	}
	if r.Method == http.MethodHead {
		linkLooksGood(w)
		return
	}
	sess, _, _ := h.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowCallback, CallbackURL: callback.String(), CallbackSessionID: cliSession})
	h.beginLogin(w, r, flow{SessionID: sess.ID, ClusterID: clusterID, ClusterKind: clusterCallback,
		CallbackURL: sess.CallbackURL, CLISessionID: cliSession}.encode())
}

// BeginRedirectLogin starts the login of a v1alpha2 flow whose result
// goes to the released CLI's localhost callback (checked by the caller,
// internal/httpapi/v1alpha2): `kubectl bind login` (FlowCLILogin, no
// cluster) or plain `kubectl bind` (FlowBrowserV1alpha2, binding as
// clusterID, the CLI's unproven consumer_id). A HEAD creates nothing.
func (h *Handler) BeginRedirectLogin(w http.ResponseWriter, r *http.Request, sf sessionkey.Flow, callbackURL, cliSessionID, clusterID string) {
	if h.cfg.NoCallbackFlow {
		h.RefuseCallbackFlow(w)
		return
	}
	kind := clusterCallback
	switch {
	case sf == sessionkey.FlowCLILogin && h.cfg.Tokens != nil:
		kind, clusterID = clusterNone, ""
	case sf == sessionkey.FlowBrowserV1alpha2 && h.svc.CanBind(sf) && clusterID != "":
	default:
		w.Header().Set("Retry-After", "30")
		h.page(w, http.StatusServiceUnavailable, pageIdPDown, "")
		return
	}
	if r.Method == http.MethodHead {
		linkLooksGood(w)
		return
	}
	sess, _, _ := h.svc.CreateSession(lifecycle.SessionRequest{Flow: sf, CallbackURL: callbackURL, CallbackSessionID: cliSessionID})
	h.beginLogin(w, r, flow{SessionID: sess.ID, ClusterID: clusterID, ClusterKind: kind,
		CallbackURL: callbackURL, CLISessionID: cliSessionID}.encode())
}

// RefuseCallbackFlow renders the page of a callback-flow link (v1alpha1's
// p or u, v1alpha2's CLI login or browser flow) with the callback flow
// off: 404, before any login.
func (h *Handler) RefuseCallbackFlow(w http.ResponseWriter) {
	h.page(w, http.StatusNotFound, pageNoCallbackFlow, "")
}

// RefuseLink renders the page of a link refused before any login.
func (h *Handler) RefuseLink(w http.ResponseWriter, status int, problem string) {
	h.page(w, status, pageBadCallback, problem)
}

// linkLooksGood answers a HEAD of a link that a GET would act on. HEAD
// must have no side effect (RFC 9110 §9.2.1), but the GET of a good link
// begins a login (a state made for this browser, its binding cookie, a
// redirect to the identity provider). Link previews, mail scanners and
// link checkers send HEAD to see whether a link is alive; a 405 makes
// most of them retry with GET. So a good link answers 200 text/html with
// no body and nothing changed, and a bad one the same error status its
// GET gets.
func linkLooksGood(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}

// callbackURL returns where the callback flow ends: http://localhost:<p>/callback
// for p, else u when it is an http URL on a loopback host or equals an
// entry of the allow-list. Anything else is refused: an open redirect here
// would hand a kubeconfig to whoever crafted the link.
func (h *Handler) callbackURL(q url.Values) (*url.URL, string) {
	if q.Has("p") == q.Has("u") {
		return nil, "exactly one of p and u must be given"
	}
	if q.Has("p") {
		p, _ := protocol.Single(q, "p")
		port, ok := protocol.Port(p)
		if !ok {
			return nil, "p must be a port number from 1 to 65535, in digits only"
		}
		return &url.URL{Scheme: "http", Host: net.JoinHostPort("localhost", strconv.Itoa(port)), Path: "/callback"}, ""
	}
	raw, ok := protocol.Single(q, "u")
	if !ok || len(raw) > maxCallbackURL {
		return nil, "u must be given once"
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.User != nil || u.Fragment != "" || u.Opaque != "" {
		return nil, "u is not a plain absolute URL"
	}
	// A port no browser can reach would lose the response after the
	// binding was made, as p=+41234 did.
	if port := u.Port(); port != "" {
		if _, ok := protocol.Port(port); !ok {
			return nil, "u's port must be a number from 1 to 65535, in digits only"
		}
	}
	if u.Scheme == "http" && isLoopback(u.Hostname()) {
		return u, ""
	}
	for _, allowed := range h.allowList {
		if equalsAllowed(u, allowed) && !hasDotSegment(u.EscapedPath()) {
			return u, ""
		}
	}
	if len(h.allowList) > 0 {
		return nil, "u must be an http URL on this computer (localhost, 127.0.0.1 or [::1]) or one of the URLs this provider allows"
	}
	return nil, "u must be an http URL on this computer (localhost, 127.0.0.1 or [::1])"
}

// maxCallbackURL bounds u: the callback URL travels in the login state
// (at most 1 KiB with the rest of the flow).
const maxCallbackURL = 512

// hasDotSegment: a "." or ".." path segment, also percent-encoded or
// after a backslash, which a browser resolves, leaving the URL it was
// checked as behind.
func hasDotSegment(escapedPath string) bool {
	for _, seg := range strings.FieldsFunc(escapedPath, func(r rune) bool { return r == '/' || r == '\\' }) {
		switch strings.ReplaceAll(strings.ToLower(seg), "%2e", ".") {
		case ".", "..":
			return true
		}
	}
	return false
}

func isLoopback(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

// ParseCallbackAllowList reads the entries of Config.CallbackAllowList
// (--callback-allowed-urls): whole callback URLs scheme://host[:port][/path],
// each matched exactly (equalsAllowed). Every entry that is not one is an
// error of its own.
func ParseCallbackAllowList(entries []string) ([]*url.URL, []error) {
	var out []*url.URL
	var errs []error
	for _, e := range entries {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
			u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || hasDotSegment(u.EscapedPath()) {
			errs = append(errs, errors.New(strconv.Quote(e)+": want a callback URL scheme://host[:port][/path], matched exactly, e.g. https://cli.example.com/callback"))
			continue
		}
		out = append(out, u)
	}
	return out, errs
}

// equalsAllowed: u is the allow-listed URL: same scheme and host (port
// included; both case-insensitive), the same path (an empty path is "/"),
// and no query. Nothing below the path, nothing beside it.
func equalsAllowed(u, allowed *url.URL) bool {
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return false
	}
	if !strings.EqualFold(u.Scheme, allowed.Scheme) || !strings.EqualFold(u.Host, allowed.Host) {
		return false
	}
	return rootedPath(u.EscapedPath()) == rootedPath(allowed.EscapedPath())
}

// rootedPath: "" and "/" are the same path to a browser.
func rootedPath(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// beginLogin sends the browser to the identity provider with the flow
// state of a session (flowState).
func (h *Handler) beginLogin(w http.ResponseWriter, r *http.Request, state []byte) {
	target, err := h.cfg.Login.Begin(w, r, state)
	if errors.Is(err, oidc.ErrNotReady) {
		w.Header().Set("Retry-After", "30")
		h.page(w, http.StatusServiceUnavailable, pageIdPDown, "")
		return
	}
	if err != nil {
		h.internalError(w, "starting the login", err)
		return
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}
