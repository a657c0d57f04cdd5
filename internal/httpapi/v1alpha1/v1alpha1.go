// Package v1alpha1 serves the kube-bind.io/v1alpha1 HTTP API of
// docs/protocol.md below the external URL's path: discovery (GET
// /export) and the poll flow's sessions (POST /sessions); and its
// BindingResponse (Render). The polls (GET /poll) are internal/httpapi's,
// the browser routes (/authorize, /callback, /bind) internal/httpapi/browser's.
package v1alpha1

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	"github.com/kbprovider/backend/internal/httpapi/respond"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// ProtocolVersion is the kube-bind protocol level advertised in the
// BindingProvider's version: a strict semver at or above v0.3.0, which
// released CLIs require.
const ProtocolVersion = "v0.4.8"

// Paths, below the external URL's path. /poll, /authorize are where the
// discovery document sends clients.
const (
	PathExport    = "/export"
	PathSessions  = "/sessions"
	PathPoll      = "/poll"
	PathAuthorize = "/authorize"
)

// Config configures the Handler.
type Config struct {
	// ExternalURL is the public URL of the backend; every advertised URL
	// is built from it. Required.
	ExternalURL *url.URL
	// PrettyName is the provider's name shown to consumers.
	PrettyName string
	// PollInterval (default pollsession.DefaultPollInterval) and
	// LongPollMaxWait (0: no long polls) go into the poll method.
	PollInterval    time.Duration
	LongPollMaxWait time.Duration
	// NoCallbackFlow: discovery advertises the poll flow only, not
	// OAuth2CodeGrant.
	NoCallbackFlow bool
	// Sessions creates the poll sessions. Required.
	Sessions *pollsession.Creator
}

// Handler serves the routes.
type Handler struct {
	export        []byte
	createSession http.HandlerFunc
}

// New checks cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.ExternalURL == nil || cfg.Sessions == nil {
		return nil, errors.New("v1alpha1: ExternalURL and Sessions are required")
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = pollsession.DefaultPollInterval
	}
	doc, err := exportDocument(cfg)
	if err != nil {
		return nil, err
	}
	return &Handler{export: doc, createSession: cfg.Sessions.Handler(sessionkey.FlowPoll, v1alpha1.GroupVersion)}, nil
}

// Mount mounts the routes below the external URL's path.
func (h *Handler) Mount(r mount.Router) {
	r.Handle(mount.Route{Method: http.MethodGet, Path: PathExport, Handler: h.serveExport})
	r.Handle(mount.Route{Method: http.MethodPost, Path: PathSessions, Handler: h.createSession, Creates: mount.CreatesSession})
}

// exportDocument renders the BindingProvider once: it only depends on the
// configuration. The poll method comes first; released CLIs skip it and
// take the OAuth2CodeGrant entry, which is left out when the callback
// flow is off (Config.NoCallbackFlow).
func exportDocument(cfg Config) ([]byte, error) {
	prefix := strings.TrimSuffix(cfg.ExternalURL.EscapedPath(), "/")
	at := func(path string) string {
		u := url.URL{Scheme: cfg.ExternalURL.Scheme, Host: cfg.ExternalURL.Host, Path: prefix + path}
		if cfg.ExternalURL.RawPath != "" {
			u.RawPath = prefix + path
			if p, err := url.PathUnescape(u.RawPath); err == nil {
				u.Path = p
			}
		}
		return u.String()
	}
	doc := v1alpha1.BindingProvider{
		APIVersion:         v1alpha1.ProviderAPIVersion,
		Kind:               v1alpha1.KindBindingProvider,
		ProviderPrettyName: cfg.PrettyName,
		Version:            ProtocolVersion,
		AuthenticationMethods: []v1alpha1.AuthenticationMethod{
			{
				Method: v1alpha1.MethodOAuth2CodeGrantPoll,
				OAuth2CodeGrantPoll: &v1alpha1.OAuth2CodeGrantPoll{
					SessionURL:       at(PathSessions),
					AuthenticatedURL: at(PathAuthorize),
					PollURL:          at(PathPoll),
					PollInterval:     cfg.PollInterval.String(),
				},
			},
			{
				Method:          v1alpha1.MethodOAuth2CodeGrant,
				OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: at(PathAuthorize)},
			},
		},
	}
	if cfg.NoCallbackFlow {
		doc.AuthenticationMethods = doc.AuthenticationMethods[:1]
	}
	if d := cfg.LongPollMaxWait; d > 0 {
		doc.AuthenticationMethods[0].OAuth2CodeGrantPoll.LongPollMaxWait = d.String()
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func (h *Handler) serveExport(w http.ResponseWriter, _ *http.Request) {
	respond.JSONBytes(w, http.StatusOK, h.export)
}
