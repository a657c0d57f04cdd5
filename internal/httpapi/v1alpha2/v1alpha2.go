// Package v1alpha2 serves the kube-bind.io/v1alpha2 HTTP API of the
// released kubectl-bind v0.6–v0.8 (docs/v1alpha2.md §2.4): discovery
// (GET /api/exports, GET /exports), the poll flow's sessions (POST
// /api/sessions), the CLI login (GET /api/authorize), the bearer-token
// routes (GET /api/templates, GET /api/collections, POST /api/bind) and
// the entry of plain `kubectl bind`'s browser flow (GET /), all at the
// host root; and its BindingResponse (Render).
//
// The handlers parse, call and render: lifecycle binds, clitoken
// checks tokens, the browser handler (internal/httpapi/browser) runs the
// logins and the selection page.
package v1alpha2

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/pace"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// ProtocolVersion is the BindingProvider's version: the release whose
// protocol this package speaks.
const ProtocolVersion = "v0.8.2"

// Paths, at the host root.
const (
	PathExports     = "/api/exports"
	PathExportsOld  = "/exports"
	PathAuthorize   = "/api/authorize"
	PathTemplates   = "/api/templates"
	PathCollections = "/api/collections"
	PathBind        = "/api/bind"
	PathSessions    = "/api/sessions"
	PathRoot        = "/"
)

// AnnotationImplicit marks a template made from one exported CRD, not
// from an APIServiceExportTemplate.
const AnnotationImplicit = "kube-bind.io/implicit"

// Browser runs the logins of the flows whose result goes to a CLI's
// localhost callback (implemented by *browser.Handler).
type Browser interface {
	// BeginRedirectLogin starts the login of a session of flow (the CLI
	// login or the browser flow) for the checked callbackURL, echoing
	// cliSessionID, binding as clusterID (browser flow only).
	BeginRedirectLogin(w http.ResponseWriter, r *http.Request, flow sessionkey.Flow, callbackURL, cliSessionID, clusterID string)
	// RefuseLink renders the HTML page of a link refused before any
	// login, with status and what was wrong.
	RefuseLink(w http.ResponseWriter, status int, problem string)
	// RefuseCallbackFlow renders the page of a callback-flow link on a
	// provider that has the callback flow off.
	RefuseCallbackFlow(w http.ResponseWriter)
}

// Config configures the Handler.
type Config struct {
	// ExternalURL is the backend's public URL; the v1alpha1 routes the
	// discovery document names (/authorize, /poll) are below its path.
	ExternalURL *url.URL
	PrettyName  string
	// Sessions binds, and lists and resolves offers. Required.
	Sessions *lifecycle.Service
	// PollSessions creates the poll flow's sessions. Required.
	PollSessions *pollsession.Creator
	// Tokens verify CLI tokens; nil: the bearer routes answer 503.
	Tokens *clitoken.Tokens
	// Issuer is the OIDC issuer the tokens' subjects belong to.
	Issuer string
	// Allows judges a token's user by the allow-lists of the moment, so
	// that a user removed from them cannot bind with a token issued
	// before; nil: everybody.
	Allows func(clitoken.User) bool
	// Browser runs logins; nil: /api/authorize and / answer 503.
	Browser Browser
	// PollInterval and LongPollMaxWait go into the poll method.
	PollInterval    time.Duration
	LongPollMaxWait time.Duration
	// NoCallbackFlow (--callback-flow=false): discovery offers the poll
	// method only, and the routes of the flows that end at the CLI's
	// localhost callback (the CLI login, the browser flow) and of the
	// CLI token the login hands out (templates, collections, bind)
	// answer 404, before any login.
	NoCallbackFlow bool
	// RequestRate paces the bearer routes per user (subject), per second,
	// with a burst of three seconds' worth; BindRate paces POST /api/bind
	// per user, per minute, with a burst of clitoken.BindBurst. 0: no
	// limit (clitoken.Options).
	RequestRate float64
	BindRate    float64
	// Now is the clock of the pacing (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Handler serves the routes.
type Handler struct {
	cfg           Config
	log           *slog.Logger
	exports       []byte
	createSession http.HandlerFunc
	// requests and binds pace the bearer routes per subject.
	requests, binds *pace.Limiter[string]
}

// maxPacedUsers bounds the users whose pace is remembered; beyond it the
// least recently seen is forgotten (a full bucket again).
const maxPacedUsers = 16384

// New checks cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.ExternalURL == nil || cfg.Sessions == nil || cfg.PollSessions == nil {
		return nil, errors.New("v1alpha2: ExternalURL, Sessions and PollSessions are required")
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = pollsession.DefaultPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, log: cfg.Logger,
		requests:      pace.New[string](cfg.RequestRate, int(math.Ceil(3*cfg.RequestRate)), maxPacedUsers),
		binds:         pace.New[string](cfg.BindRate/60, clitoken.BindBurst, maxPacedUsers),
		createSession: cfg.PollSessions.Handler(sessionkey.FlowPollV1alpha2, v1alpha2.GroupVersion)}
	doc, err := json.Marshal(h.exportsDocument())
	if err != nil {
		return nil, err
	}
	h.exports = append(doc, '\n')
	return h, nil
}

// Mount mounts the routes at the host root.
func (h *Handler) Mount(r mount.Router) {
	for _, rt := range []mount.Route{
		{Method: http.MethodGet, Path: PathExports, Handler: h.serveExports},
		{Method: http.MethodGet, Path: PathExportsOld, Handler: h.redirectExports},
		{Method: http.MethodGet, Path: PathAuthorize, Handler: h.authorize, Creates: mount.CreatesLogin},
		{Method: http.MethodHead, Path: PathAuthorize, Handler: h.authorize},
		{Method: http.MethodGet, Path: PathTemplates, Handler: h.templates},
		{Method: http.MethodGet, Path: PathCollections, Handler: h.collections},
		{Method: http.MethodPost, Path: PathBind, Handler: h.bind},
		{Method: http.MethodGet, Path: PathRoot, Handler: h.root, Creates: mount.CreatesLogin},
		{Method: http.MethodHead, Path: PathRoot, Handler: h.root},
		{Method: http.MethodPost, Path: PathSessions, Handler: h.createSession, Creates: mount.CreatesSession},
	} {
		rt.AtHostRoot = true
		r.Handle(rt)
	}
}

// rootURL is path at the host root of the external URL; extURL is path
// below the external URL's own path.
func (h *Handler) rootURL(path string) string {
	u := url.URL{Scheme: h.cfg.ExternalURL.Scheme, Host: h.cfg.ExternalURL.Host, Path: path}
	return u.String()
}

func (h *Handler) extURL(path string) string {
	return strings.TrimSuffix(h.cfg.ExternalURL.String(), "/") + path
}

func (h *Handler) exportsDocument() v1alpha2.BindingProvider {
	doc := v1alpha2.BindingProvider{
		APIVersion:         v1alpha2.ProviderAPIVersion,
		Kind:               v1alpha2.KindBindingProvider,
		ProviderPrettyName: h.cfg.PrettyName,
		Version:            ProtocolVersion,
	}
	poll := &v1alpha2.OAuth2CodeGrantPoll{
		SessionURL:       h.rootURL(PathSessions),
		AuthenticatedURL: h.extURL("/authorize"),
		PollURL:          h.extURL("/poll"),
		PollInterval:     h.cfg.PollInterval.String(),
	}
	if h.cfg.LongPollMaxWait > 0 {
		poll.LongPollMaxWait = h.cfg.LongPollMaxWait.String()
	}
	doc.AuthenticationMethods = append(doc.AuthenticationMethods,
		v1alpha2.AuthenticationMethod{Method: v1alpha2.MethodOAuth2CodeGrantPoll, OAuth2CodeGrantPoll: poll})
	if h.cfg.NoCallbackFlow {
		return doc
	}
	doc.AuthenticationMethods = append(doc.AuthenticationMethods, v1alpha2.AuthenticationMethod{
		Method:          v1alpha2.MethodOAuth2CodeGrant,
		OAuth2CodeGrant: &v1alpha2.OAuth2CodeGrant{AuthenticatedURL: h.rootURL(PathAuthorize)},
	})
	return doc
}

func (h *Handler) serveExports(w http.ResponseWriter, _ *http.Request) {
	writeJSONBytes(w, http.StatusOK, h.exports)
}

// redirectExports sends v0.5 CLIs (which GET the URL as typed) on to
// /api/exports, the query kept.
func (h *Handler) redirectExports(w http.ResponseWriter, r *http.Request) {
	target := PathExports
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusFound)
}

// authorize is GET /api/authorize of `kubectl bind login`: refused with
// 400 before any login unless the query is exactly right.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request) {
	if h.cfg.NoCallbackFlow {
		h.callbackFlowOff(w)
		return
	}
	if h.cfg.Browser == nil || h.cfg.Tokens == nil {
		h.unavailablePage(w)
		return
	}
	req, err := ParseLoginQuery(r.URL.RawQuery)
	if err != nil {
		h.log.Info("CLI login refused before the login", "problem", err.Error())
		h.cfg.Browser.RefuseLink(w, http.StatusBadRequest, err.Error())
		return
	}
	h.cfg.Browser.BeginRedirectLogin(w, r, sessionkey.FlowCLILogin, req.RedirectURL, req.SessionID, "")
}

// root is GET / of plain `kubectl bind`.
func (h *Handler) root(w http.ResponseWriter, r *http.Request) {
	if h.cfg.NoCallbackFlow {
		h.callbackFlowOff(w)
		return
	}
	if h.cfg.Browser == nil {
		h.unavailablePage(w)
		return
	}
	req, err := ParseBrowserQuery(r.URL.RawQuery)
	if err != nil {
		h.log.Info("browser bind refused before the login", "problem", err.Error())
		h.cfg.Browser.RefuseLink(w, http.StatusBadRequest, err.Error())
		return
	}
	h.cfg.Browser.BeginRedirectLogin(w, r, sessionkey.FlowBrowserV1alpha2, req.RedirectURL, req.SessionID, req.ConsumerID)
}

// callbackFlowOff answers a browser-flow or CLI-login link with the
// callback flow off: 404 before any login, creating nothing.
func (h *Handler) callbackFlowOff(w http.ResponseWriter) {
	if h.cfg.Browser != nil {
		h.cfg.Browser.RefuseCallbackFlow(w)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusNotFound)
	io.WriteString(w, noCallbackFlow+"\n")
}

// noCallbackFlow says why the released CLI's flows are refused.
const noCallbackFlow = "this provider binds with the poll flow only (OAuth2CodeGrantPoll, e.g. kube-bind-poll): " +
	"kubectl bind login, the browser flow and the CLI token routes are off"

func (h *Handler) unavailablePage(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "30")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, "Sign-in is not configured on this provider yet.\n")
}

// authenticated checks the bearer token and the cluster_id the CLI may
// append; it answers the refusal itself.
func (h *Handler) authenticated(w http.ResponseWriter, r *http.Request) (clitoken.Claims, bool) {
	if h.cfg.NoCallbackFlow {
		// The token came from the CLI login, which is off: a token
		// issued before the switch is not honoured either.
		writeError(w, http.StatusNotFound, v1alpha2.ErrorResourceNotFound, noCallbackFlow)
		return clitoken.Claims{}, false
	}
	if h.cfg.Tokens == nil || !h.cfg.Sessions.CanBind(sessionkey.FlowPollV1alpha2) {
		w.Header().Set("Retry-After", "30")
		writeError(w, http.StatusServiceUnavailable, v1alpha2.ErrorUnavailable, "sign-in is not configured on this provider yet")
		return clitoken.Claims{}, false
	}
	token, ok := bearer(r.Header.Values("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kube-bind"`)
		writeError(w, http.StatusUnauthorized, v1alpha2.ErrorAuthenticationFailed, "a bearer token is required: run kubectl bind login")
		return clitoken.Claims{}, false
	}
	c, err := h.cfg.Tokens.Verify(token)
	if errors.Is(err, clitoken.ErrUnjudged) {
		h.log.Warn("CLI token not judged: the revocations are not read", "path", r.URL.Path, "error", err)
		w.Header().Set("Retry-After", "10")
		writeError(w, http.StatusServiceUnavailable, v1alpha2.ErrorUnavailable, "the provider cannot check tokens right now; try again in a moment")
		return clitoken.Claims{}, false
	}
	if err != nil {
		// Never the token itself.
		h.log.Info("CLI token refused", "path", r.URL.Path, "reason", err.Error())
		w.Header().Set("WWW-Authenticate", `Bearer realm="kube-bind", error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, v1alpha2.ErrorAuthenticationFailed, err.Error()+": run kubectl bind login again")
		return clitoken.Claims{}, false
	}
	if !h.paced(w, r, h.requests, c, "requests") {
		return clitoken.Claims{}, false
	}
	if h.cfg.Allows != nil && !h.cfg.Allows(c.User) {
		h.log.Info("CLI token of a user the allow-lists no longer admit", "path", r.URL.Path, "token", c.ID)
		writeError(w, http.StatusForbidden, v1alpha2.ErrorAuthorizationFailed, "you are not allowed to bind at this provider (any more)")
		return clitoken.Claims{}, false
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if cid, present, ok := optional(q, "cluster_id"); err != nil || !ok || (present && cid != "") {
		writeError(w, http.StatusBadRequest, v1alpha2.ErrorBadRequest, "cluster_id must be empty or absent: this provider has one cluster")
		return clitoken.Claims{}, false
	}
	return c, true
}

// paced takes a token of the user's bucket in lim, or answers 429 with
// Retry-After.
func (h *Handler) paced(w http.ResponseWriter, r *http.Request, lim *pace.Limiter[string], c clitoken.Claims, what string) bool {
	wait := lim.Allow(c.Subject, h.cfg.Now())
	if wait <= 0 {
		return true
	}
	sec := int64(math.Ceil(wait.Seconds()))
	h.log.Info("CLI token user paced", "path", r.URL.Path, "token", c.ID, "retryAfterSeconds", sec)
	w.Header().Set("Retry-After", strconv.FormatInt(sec, 10))
	writeError(w, http.StatusTooManyRequests, v1alpha2.ErrorBadRequest,
		"too many "+what+" with your CLI token in a short time; try again in "+strconv.FormatInt(sec, 10)+" s")
	return false
}

// bearer returns the token of the one Authorization header "Bearer
// <token>" (the scheme in any case).
func bearer(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return "", false
	}
	return token, true
}

// templates is GET /api/templates: every offer as an
// APIServiceExportTemplate.
func (h *Handler) templates(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.authenticated(w, r); !ok {
		return
	}
	list := v1alpha2.APIServiceExportTemplateList{
		APIVersion: v1alpha2.GroupVersion, Kind: v1alpha2.KindAPIServiceExportTemplateList,
		Items: []v1alpha2.APIServiceExportTemplate{},
	}
	for _, o := range h.cfg.Sessions.Offers() {
		list.Items = append(list.Items, Template(o))
	}
	writeJSON(w, http.StatusOK, list)
}

// Template is offer o as an APIServiceExportTemplate.
func Template(o offers.Offer) v1alpha2.APIServiceExportTemplate {
	req := Request(o.Name, o)
	t := v1alpha2.APIServiceExportTemplate{
		APIVersion: v1alpha2.GroupVersion, Kind: v1alpha2.KindAPIServiceExportTemplate,
		Metadata: metav1.ObjectMeta{Name: o.Name},
		Spec: v1alpha2.APIServiceExportTemplateSpec{
			Description: o.Description, Resources: req.Spec.Resources, PermissionClaims: req.Spec.PermissionClaims,
			Namespaces: req.Spec.Namespaces, SchemaUpdatePolicy: o.SchemaUpdatePolicy,
		},
	}
	if o.Implicit {
		t.Metadata.Annotations = map[string]string{AnnotationImplicit: "true"}
	}
	return t
}

// collections is GET /api/collections.
func (h *Handler) collections(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.authenticated(w, r); !ok {
		return
	}
	list := v1alpha2.CollectionList{APIVersion: v1alpha2.GroupVersion, Kind: v1alpha2.KindCollectionList, Items: []v1alpha2.Collection{}}
	for _, c := range h.cfg.Sessions.Collections() {
		col := v1alpha2.Collection{
			APIVersion: v1alpha2.GroupVersion, Kind: v1alpha2.KindCollection,
			Metadata: metav1.ObjectMeta{Name: c.Name},
			Spec:     v1alpha2.CollectionSpec{Description: c.Description, Templates: []v1alpha2.NameRef{}},
		}
		for _, name := range c.Offers {
			col.Spec.Templates = append(col.Spec.Templates, v1alpha2.NameRef{Name: name})
		}
		list.Items = append(list.Items, col)
	}
	writeJSON(w, http.StatusOK, list)
}

// bind is POST /api/bind (`kubectl bind apiservice --template-name`).
func (h *Handler) bind(w http.ResponseWriter, r *http.Request) {
	claims, ok := h.authenticated(w, r)
	if !ok || !h.paced(w, r, h.binds, claims, "binds") {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBindBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, v1alpha2.ErrorBadRequest, "the body is too large")
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, v1alpha2.ErrorBadRequest, "the body could not be read")
		return
	}
	req, err := ParseBindRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, v1alpha2.ErrorBadRequest, err.Error())
		return
	}
	offer, ok := h.cfg.Sessions.Offer(req.Template)
	if !ok {
		writeError(w, http.StatusNotFound, v1alpha2.ErrorResourceNotFound, "the template "+req.Template+" is not offered by this provider")
		return
	}
	consumer := binding.Consumer{Issuer: h.cfg.Issuer, Subject: claims.Subject,
		Claims: &binding.Claims{Email: claims.Email, Groups: claims.Groups, GroupsKnown: claims.GroupsKnown}}
	resp, err := h.cfg.Sessions.BindDirect(r.Context(), lifecycle.V1alpha2, consumer, req.ClusterIdentity, claims.ID,
		lifecycle.Pick{Name: req.Name, Offer: offer})
	var (
		problem *lifecycle.SelectionError
		refused *lifecycle.RefusedError
		bound   *binding.AlreadyBoundError
	)
	switch {
	case err == nil:
	case errors.As(err, &refused):
		h.log.Info("bind refused", "consumer", consumer.ID(), "token", claims.ID, "cluster", req.ClusterIdentity, "reason", refused.Reason)
		writeError(w, http.StatusForbidden, v1alpha2.ErrorAuthorizationFailed, refused.Reason)
		return
	case errors.As(err, &bound) && errors.As(err, &problem):
		// Its request would fail: the resource is bound under another name.
		writeError(w, http.StatusConflict, v1alpha2.ErrorBadRequest, problem.Problem)
		return
	case errors.As(err, &problem):
		// The catalog changed under the offer.
		writeError(w, http.StatusNotFound, v1alpha2.ErrorResourceNotFound, problem.Problem)
		return
	case errors.Is(err, binding.ErrInvalidIdentity):
		writeError(w, http.StatusBadRequest, v1alpha2.ErrorBadRequest, "the consumer identity cannot be bound")
		return
	case errors.Is(err, lifecycle.ErrProvisioning):
		h.log.Warn("provisioning failed", "consumer", consumer.ID(), "token", claims.ID, "error", err)
		w.Header().Set("Retry-After", "10")
		writeError(w, http.StatusServiceUnavailable, v1alpha2.ErrorUnavailable, "the provider cluster could not set the binding up; try again in a moment")
		return
	case errors.Is(err, sessions.ErrUnavailable):
		// Bound, but its delivery could not be recorded: nothing is
		// handed out; the same bind again completes it.
		h.log.Warn("bind not delivered", "consumer", consumer.ID(), "token", claims.ID, "error", err)
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, v1alpha2.ErrorUnavailable, "the provider cluster could not record the binding's delivery; try again in a moment")
		return
	default:
		h.log.Error("bind failed", "consumer", consumer.ID(), "token", claims.ID, "error", err)
		writeError(w, http.StatusInternalServerError, v1alpha2.ErrorInternal, "the binding failed")
		return
	}
	h.log.Info("bound", "flow", "template", "consumer", consumer.ID(), "token", claims.ID, "cluster", req.ClusterIdentity,
		"template", req.Template, "request", req.Name)
	writeJSONBytes(w, http.StatusOK, append(resp, '\n'))
}

func writeJSONBytes(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, v1alpha2.ErrorInternal, "the answer could not be encoded")
		return
	}
	writeJSONBytes(w, status, append(b, '\n'))
}

// writeError answers status with the v1alpha2 Error body.
func writeError(w http.ResponseWriter, status int, code, message string) {
	b, _ := json.Marshal(v1alpha2.NewError(code, message))
	writeJSONBytes(w, status, append(b, '\n'))
}
