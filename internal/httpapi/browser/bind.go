package browser

import (
	"context"
	"encoding/base64"
	"errors"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/kubeerr"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

// maxFormBytes bounds the selection form; a few hundred APIs fit.
const maxFormBytes = 32 << 10

// callback finishes the login at the identity provider and moves the
// browser on to the API selection page. Nothing is written before a user
// signed in (oidc's Finish spends the login state only then): a callback
// that signs nobody in, forged or genuine, only renders a page.
func (h *Handler) callback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id, flow, err := h.cfg.Login.Finish(w, r)
	if flow == nil {
		h.loginStateFailed(w, err)
		return
	}
	f, ok := parseFlow(flow)
	if !ok {
		// Only a login begun by an older version of the backend gets here.
		h.loginStateFailed(w, errors.New("flow state of another format"))
		return
	}
	sess, serr := h.session(f)
	if serr != nil {
		h.page(w, http.StatusGone, pageExpired, "")
		return
	}
	if errors.Is(err, oidc.ErrIdPUnavailable) || errors.Is(err, oidc.ErrNotReady) {
		// Transient: the session stays pending, and this browser, which
		// just proved it started the login, may start it again.
		h.log.Warn("login could not be finished: the identity provider is unavailable; the session stays pending", "session", sess.ID, "error", err)
		h.idpUnavailable(w, r, flow)
		return
	}
	if err != nil && !errors.Is(err, oidc.ErrAccessDenied) {
		// Nobody signed in (the provider's error, a bad code, a bad ID
		// token): nothing is recorded, since anybody holding a link can
		// send this. The session stays pending and its link unspent:
		// the user may open it again, or the client waits until the
		// session expires.
		h.loginNotFinished(w, r, sess, err)
		return
	}
	if err != nil {
		// A user signed in whom the provider refuses: the session ends,
		// so that the client stops waiting and says why.
		reason, status, kind := loginRefusal(err)
		if derr := h.svc.Deny(ctx, sess, reason); derr != nil {
			h.log.Warn("denying a session after a refused login", "session", sess.ID, "error", derr)
		}
		h.log.Info("login refused", "session", sess.ID, "reason", reason, "error", err)
		if redirectsToCLI(sess) {
			h.redirectError(w, r, sess, oauthError(err), reason)
			return
		}
		h.page(w, status, kind, reason)
		return
	}
	if !h.stillPending(ctx, w, sess) {
		return
	}
	if h.cfg.NoCallbackFlow && sess.CallbackURL != "" {
		// Begun on a replica (or before a restart) with the flow on:
		// nothing goes to a callback from here.
		h.RefuseCallbackFlow(w)
		return
	}
	if sess.Flow.Polled() {
		// The link completes one login at most: its nonce is spent by
		// the first login through it, whichever replica serves it.
		switch err := h.svc.UseLink(ctx, sess, f.LinkNonce); {
		case errors.Is(err, sessions.ErrNonceUsed):
			h.page(w, http.StatusUnauthorized, pageLinkUsed, "")
			return
		case err != nil:
			h.loginStoreFailed(w, err)
			return
		}
	}
	if sess.Flow == sessionkey.FlowCLILogin {
		h.finishCLILogin(w, r, sess, id)
		return
	}
	lc := loginCookie{Flow: f, Issuer: id.Issuer, Subject: id.Subject, Email: id.Email, EmailVerified: id.EmailVerified, CSRF: newCSRFToken()}
	lc.Groups, lc.GroupsKnown = binding.RecordableGroups(id.Groups)
	if err := h.setLoginCookie(w, lc); err != nil {
		h.internalError(w, "setting the login cookie", err)
		return
	}
	http.Redirect(w, r, h.path("/bind")+"?s="+url.QueryEscape(sess.ID), http.StatusSeeOther)
}

// loginNotFinished answers a callback with a genuine state after which
// nobody signed in. It records nothing: the page (or, in the v1alpha2
// flows, the CLI's callback) says what happened.
func (h *Handler) loginNotFinished(w http.ResponseWriter, r *http.Request, sess lifecycle.Session, err error) {
	reason, status, kind := loginRefusal(err)
	h.log.Info("login not finished; nothing recorded", "session", sess.ID, "reason", reason, "error", err)
	if redirectsToCLI(sess) {
		h.redirectError(w, r, sess, oauthError(err), reason)
		return
	}
	p := errorPages[kind]
	p.ProviderName = h.cfg.ProviderName
	p.Message += " (" + reason + ")"
	if sess.Flow.Polled() {
		p.Hint = notFinishedHint
	}
	web.RenderError(w, status, p)
}

// notFinishedHint: after a login that signed nobody in, the poll flow's
// link still works and its client still waits.
const notFinishedHint = "Nothing was recorded: to try again, open the link from your terminal again. Otherwise stop the command there; it waits until the session expires."

// idpUnavailable answers a login the identity provider could not finish
// with 503, Retry-After and a "Try again" link that starts a new login for
// the same session and cluster decision (the old state's cookie is
// cleared; nothing was spent).
func (h *Handler) idpUnavailable(w http.ResponseWriter, r *http.Request, flow []byte) {
	p := errorPages[pageIdPRetry]
	p.ProviderName = h.cfg.ProviderName
	if target, err := h.cfg.Login.Begin(w, r, flow); err == nil {
		p.RetryURL = target
	}
	w.Header().Set("Retry-After", "10")
	web.RenderError(w, http.StatusServiceUnavailable, p)
}

// loginRefusal maps a failed login with a genuine state to what the CLI and
// the page are told.
func loginRefusal(err error) (reason string, status int, kind pageKind) {
	var pe *oidc.ProviderError
	switch {
	case errors.As(err, &pe):
		return "the identity provider refused the login (" + pe.Code + ")", http.StatusForbidden, pageDenied
	case errors.Is(err, oidc.ErrAccessDenied):
		return "this user may not bind APIs of this provider", http.StatusForbidden, pageDenied
	case errors.Is(err, oidc.ErrInvalidCallback):
		// What the browser brought back is wrong (no code, a foreign
		// issuer, a code the provider refuses): the client's mistake.
		return "the sign-in came back incomplete or altered", http.StatusBadRequest, pageLoginFailed
	default:
		return "the login at the identity provider failed", http.StatusBadGateway, pageLoginFailed
	}
}

// redirectsToCLI: the v1alpha2 flows that end at the CLI's callback tell
// it about a failure there too (the CLI waits for its callback).
func redirectsToCLI(sess lifecycle.Session) bool {
	return sess.CallbackURL != "" && (sess.Flow == sessionkey.FlowCLILogin || sess.Flow == sessionkey.FlowBrowserV1alpha2)
}

// oauthError is the OAuth2 error code (RFC 6749 §4.1.2.1) of a refused
// login.
func oauthError(err error) string {
	var pe *oidc.ProviderError
	switch {
	case errors.As(err, &pe), errors.Is(err, oidc.ErrAccessDenied):
		return "access_denied"
	case errors.Is(err, oidc.ErrInvalidCallback):
		return "invalid_request"
	}
	return "server_error"
}

// finishCLILogin ends `kubectl bind login`: it mints the CLI token for the
// logged-in user and sends the browser to the CLI's callback with it
// (docs/v1alpha2.md §2.4). The token is never logged; its ID is.
func (h *Handler) finishCLILogin(w http.ResponseWriter, r *http.Request, sess lifecycle.Session, id oidc.Identity) {
	user := clitoken.User{Subject: id.Subject, Groups: id.Groups, GroupsKnown: true}
	if id.EmailVerified {
		user.Email = id.Email
	}
	token, claims, err := h.cfg.Tokens.Issue(id.Issuer, user)
	if err != nil {
		h.log.Warn("no CLI token for this login", "session", sess.ID, "consumer", binding.Consumer{Issuer: id.Issuer, Subject: id.Subject}.ID(), "error", err)
		h.redirectError(w, r, sess, "server_error", "this provider cannot issue a token to this user")
		return
	}
	expiresIn := int64(claims.ExpiresAt.Sub(h.cfg.Now()) / time.Second)
	h.log.Info("CLI token issued", "session", sess.ID, "token", claims.ID,
		"consumer", binding.Consumer{Issuer: id.Issuer, Subject: id.Subject}.ID(), "expiresAt", claims.ExpiresAt)
	q := url.Values{}
	q.Set("access_token", token)
	q.Set("token_type", "Bearer")
	q.Set("expires_in", strconv.FormatInt(max(expiresIn, 0), 10))
	h.redirectCLI(w, r, sess.CallbackURL, q)
}

// emptyResponse is what an error redirect of the browser flow carries as
// binding_response: the released CLI answers 400 and keeps waiting when it
// is missing, so that it would never see the error.
var emptyResponse = base64.URLEncoding.EncodeToString([]byte("{}"))

// redirectError tells a v1alpha2 CLI's callback that the flow failed.
func (h *Handler) redirectError(w http.ResponseWriter, r *http.Request, sess lifecycle.Session, code, description string) {
	q := url.Values{}
	q.Set("error", code)
	q.Set("error_description", description)
	if sess.Flow == sessionkey.FlowBrowserV1alpha2 {
		q.Set("session_id", sess.CallbackSessionID)
		q.Set("binding_response", emptyResponse)
	}
	h.redirectCLI(w, r, sess.CallbackURL, q)
}

// redirectCLI answers 303 to the CLI's checked callback with q.
func (h *Handler) redirectCLI(w http.ResponseWriter, r *http.Request, callback string, q url.Values) {
	u, err := url.Parse(callback)
	if err != nil {
		h.internalError(w, "parsing a stored callback URL", err)
		return
	}
	u.RawQuery = q.Encode()
	noTrace(w)
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

// noTrace marks an answer whose redirect URL carries a credential: no
// cache keeps it, and the browser sends no Referer on to the callback.
// The URL itself still lands in the browser's history: the released CLIs
// read the credential from their callback's query and accept it nowhere
// else (not in a POST body).
func noTrace(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
}

// showSelection renders the API selection page for a logged-in browser.
func (h *Handler) showSelection(w http.ResponseWriter, r *http.Request) {
	lc, sess, ok := h.loggedIn(w, r, r.URL.Query().Get("s"))
	if !ok {
		return
	}
	h.renderSelection(w, r, http.StatusOK, lc, sess, nil, "")
}

func (h *Handler) renderSelection(w http.ResponseWriter, r *http.Request, status int, lc loginCookie, sess lifecycle.Session, ticked map[string]bool, problem string) {
	var apis []web.API
	switch {
	case sess.Flow.V1alpha2():
		apis = h.offeredAPIs(ticked)
	case sess.Flow == sessionkey.FlowBrowserV2:
		apis = h.catalogAPIs(ticked, true)
	default:
		apis = h.catalogAPIs(ticked, false)
	}
	user := lc.Email
	if user == "" {
		user = lc.Subject
	}
	web.RenderSelectStatus(w, status, web.SelectPage{
		ProviderName: h.cfg.ProviderName,
		User:         user,
		Action:       h.path("/bind"),
		CSRFToken:    lc.CSRF,
		Hidden:       []web.Field{{Name: "s", Value: sess.ID}},
		APIs:         apis,
		Error:        problem,
		Origin:       h.origin(sess),
		Binding:      h.bindingInfo(r.Context(), lc),
	})
}

// catalogAPIs are the v1alpha1 choices: the exported CRDs; and kbind
// v2's: the namespaced ones (docs/v2.md §1).
func (h *Handler) catalogAPIs(ticked map[string]bool, namespacedOnly bool) []web.API {
	exported := h.svc.ExportedAPIs()
	apis := make([]web.API, 0, len(exported))
	for _, e := range exported {
		if namespacedOnly && e.Scope != apiextensionsv1.NamespaceScoped {
			continue
		}
		api := web.API{
			ID: e.Name, Group: e.Group, Resource: e.Resource, Scope: string(e.Scope),
			Versions: e.Versions, Checked: ticked[e.Name],
		}
		if len(e.NoStatusSubresource) > 0 {
			api.Warning = noStatusWarning
		}
		apis = append(apis, api)
	}
	return apis
}

// offeredAPIs are the v1alpha2 choices: every offer, its claims spelled
// out, each resource once where it can (offers.Distinct), and an offer
// that shares a resource with another marked, since only one of them
// may be picked (Select refuses both).
func (h *Handler) offeredAPIs(ticked map[string]bool) []web.API {
	list := offers.Distinct(h.svc.Offers())
	overlaps := offers.Overlapping(list)
	apis := make([]web.API, 0, len(list))
	for _, o := range list {
		api := web.API{ID: o.Name, Resource: o.Name, Checked: ticked[o.Name], Description: offerDescription(o)}
		if o.Implicit && len(o.Resources) == 1 {
			api.Resource, api.Group, api.Versions = o.Resources[0].Resource, o.Resources[0].Group, o.Resources[0].Versions
		}
		if others := overlaps[o.Name]; len(others) > 0 {
			api.Warning = overlapWarning(others)
		}
		apis = append(apis, api)
	}
	return apis
}

// noStatusWarning goes with an API whose CRD has no status subresource.
const noStatusWarning = "Its status is not synced back to your cluster (the provider's CRD has no status subresource)."

// origin is what the page tells the user to check before binding: in the
// poll flow the confirmation code the client printed next to the link; in
// the callback flow, where released CLIs print no code, the address on
// the user's own machine that receives the result.
func (h *Handler) origin(sess lifecycle.Session) web.Origin {
	if sess.Flow == sessionkey.FlowBrowserV2 {
		return web.Origin{Pickup: true}
	}
	if sess.CallbackURL != "" {
		return web.Origin{CallbackURL: sess.CallbackURL}
	}
	return web.Origin{ConfirmationCode: protocol.ConfirmationCode(sess.ID)}
}

// bindingInfo says whether the bind creates a binding or updates one.
func (h *Handler) bindingInfo(ctx context.Context, lc loginCookie) web.BindingInfo {
	info := web.BindingInfo{Replaced: lc.Flow.ClusterKind == clusterReplaced}
	created, exists, err := h.svc.Existing(ctx, binding.Consumer{Issuer: lc.Issuer, Subject: lc.Subject}, lc.Flow.ClusterID)
	switch {
	case err != nil:
		h.log.Warn("cannot tell whether the binding exists", "session", lc.Flow.SessionID, "error", err)
		info.Unknown = true
	case exists:
		info.Existing, info.Since = true, created
	}
	return info
}

// bind handles the selection form: cancel, or provision and hand over.
func (h *Handler) bind(w http.ResponseWriter, r *http.Request) {
	if !h.sameOrigin(r) {
		h.page(w, http.StatusForbidden, pageCrossSite, "")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			h.page(w, http.StatusRequestEntityTooLarge, pageBadForm, "the form is too large")
			return
		}
		h.page(w, http.StatusBadRequest, pageBadForm, "the form does not parse")
		return
	}
	lc, sess, ok := h.loggedIn(w, r, r.PostForm.Get("s"))
	if !ok {
		return
	}
	if !constantTimeEqual(r.PostForm.Get(web.FieldCSRF), lc.CSRF) {
		h.page(w, http.StatusForbidden, pageCrossSite, "")
		return
	}
	ctx := r.Context()
	switch r.PostForm.Get(web.FieldAction) {
	case web.ActionCancel:
		if err := h.svc.Deny(ctx, sess, "the user cancelled the binding"); err != nil {
			h.storeFailed(w, err)
			return
		}
		h.clearLoginCookie(w)
		web.RenderCancelled(w, web.CancelledPage{ProviderName: h.cfg.ProviderName})
		return
	case web.ActionBind:
	default:
		h.page(w, http.StatusBadRequest, pageBadForm, "the form names no action")
		return
	}

	// Each generation picks from its own list: APIs of the catalog for
	// v1alpha1, offers for v1alpha2.
	var (
		names   []string
		problem *lifecycle.SelectionError
	)
	picks, err := h.svc.Select(sess, r.PostForm[web.FieldAPI])
	for _, p := range picks {
		names = append(names, p.Offer.Name)
	}
	if errors.Is(err, lifecycle.ErrNoProvider) {
		h.internalError(w, "selecting", err)
		return
	}
	if errors.As(err, &problem) {
		h.renderSelection(w, r, http.StatusUnprocessableEntity, lc, sess, tickedSet(r.PostForm[web.FieldAPI]), problem.Problem)
		return
	}
	// The user must say the page belongs to what they started (the code
	// matches their terminal); the checkbox is required in HTML too, so
	// only a hand-made POST gets here without it.
	if r.PostForm.Get(web.FieldConfirm) != web.ConfirmYes {
		h.renderSelection(w, r, http.StatusUnprocessableEntity, lc, sess, tickedSet(names), "Confirm that you started this binding yourself and that the code matches your terminal.")
		return
	}

	if h.cfg.NoCallbackFlow && sess.CallbackURL != "" {
		h.RefuseCallbackFlow(w)
		return
	}
	consumer := binding.Consumer{Issuer: lc.Issuer, Subject: lc.Subject, Claims: lc.claims()}
	body, err := h.svc.Bind(ctx, sess, consumer, lc.Flow.ClusterID, picks)
	var refused *lifecycle.RefusedError
	switch {
	case err == nil:
	case errors.As(err, &problem):
		// 422: the form was well formed, but what it asks for cannot be
		// done; the page again, saying what to fix.
		h.renderSelection(w, r, http.StatusUnprocessableEntity, lc, sess, tickedSet(names), problem.Problem)
		return
	case errors.As(err, &refused):
		// The user's own state (the cap, an unproven cluster): the
		// session is denied with the reason, which its poll shows.
		h.log.Info("bind refused", "session", sess.ID, "consumer", consumer.ID(), "cluster", lc.Flow.ClusterID, "reason", refused.Reason)
		h.clearLoginCookie(w)
		if redirectsToCLI(sess) {
			h.redirectError(w, r, sess, "access_denied", refused.Reason)
			return
		}
		h.page(w, http.StatusForbidden, pageDenied, refused.Reason)
		return
	case errors.Is(err, lifecycle.ErrProvisioning):
		h.provisionFailed(w, err, "session", sess.ID, "consumer", consumer.ID())
		return
	case errors.Is(err, lifecycle.ErrAlreadyDone):
		// A second submit of the same form: the first one delivered.
		h.page(w, http.StatusConflict, pageAlreadyDone, "")
		return
	default:
		h.storeFailed(w, err)
		return
	}
	h.clearLoginCookie(w)
	h.log.Info("bound", "session", sess.ID, "consumer", consumer.ID(), "cluster", lc.Flow.ClusterID, "clusterKind", string(lc.Flow.ClusterKind), "apis", strings.Join(names, ","))
	if sess.CallbackURL != "" {
		if sess.Flow == sessionkey.FlowBrowserV1alpha2 {
			// Padded base64url, with the CLI's session ID, 303.
			q := url.Values{}
			q.Set("session_id", sess.CallbackSessionID)
			q.Set("binding_response", base64.URLEncoding.EncodeToString(body))
			h.redirectCLI(w, r, sess.CallbackURL, q)
		} else {
			h.redirectToCLI(w, r, sess.CallbackURL, body)
		}
		return
	}
	done := web.DonePage{ProviderName: h.cfg.ProviderName, APIs: names}
	if sess.Flow == sessionkey.FlowBrowserV2 {
		done.PickupURL, done.PickupUntil = h.pickupURL(sess), sess.ExpiresAt
	}
	web.RenderDone(w, done)
}

func tickedSet(names []string) map[string]bool {
	ticked := make(map[string]bool, len(names))
	for _, n := range names {
		ticked[n] = true
	}
	return ticked
}

// redirectToCLI hands the response to a released CLI's callback: standard,
// padded base64 in the response parameter, the URL's own query kept.
func (h *Handler) redirectToCLI(w http.ResponseWriter, r *http.Request, callback string, body []byte) {
	u, err := url.Parse(callback)
	if err != nil {
		h.internalError(w, "parsing a stored callback URL", err)
		return
	}
	q := u.Query()
	q.Set("response", base64.StdEncoding.EncodeToString(body))
	u.RawQuery = q.Encode()
	noTrace(w)
	http.Redirect(w, r, u.String(), http.StatusFound)
}

// sameOrigin refuses requests a browser marks as coming from another site.
// The CSRF token is the main defence; this is a second one that costs
// nothing. Our pages send no Referer, so a form POST may carry Origin:
// null, which is accepted (the token still has to match).
func (h *Handler) sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" {
		return true
	}
	ext := h.cfg.ExternalURL
	return strings.EqualFold(origin, ext.Scheme+"://"+ext.Host)
}

// stillPending renders the right page for a session that is not pending
// any more and reports whether it is.
func (h *Handler) stillPending(ctx context.Context, w http.ResponseWriter, sess lifecycle.Session) bool {
	o, err := h.svc.Outcome(ctx, sess)
	switch {
	case err != nil:
		h.storeFailed(w, err)
	case o.State == sessions.StatePending:
		return true
	case o.State == sessions.StateCompleted:
		h.page(w, http.StatusConflict, pageAlreadyDone, "")
	default:
		h.page(w, http.StatusForbidden, pageDenied, o.DenyReason)
	}
	return false
}

// provisionFailed answers a Bind whose provisioning failed. The provider
// cluster overloaded or briefly away is 503 with Retry-After and a
// warning: the same Bind succeeds in a moment, and nothing was half-made.
// Any other failure (a refusal the backend did not expect, such as its
// own RBAC) is 502 and an error the operator must see.
func (h *Handler) provisionFailed(w http.ResponseWriter, err error, logArgs ...any) {
	logArgs = append(logArgs, "error", err)
	if kubeerr.Transient(err) {
		h.log.Warn("provisioning briefly failed", logArgs...)
		w.Header().Set("Retry-After", "10")
		h.page(w, http.StatusServiceUnavailable, pageProvisionFailed, "")
		return
	}
	h.log.Error("provisioning failed", logArgs...)
	h.page(w, http.StatusBadGateway, pageProvisionFailed, "")
}
