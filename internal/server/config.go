package server

import (
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
)

// Config is everything the backend is built from: plain, already
// validated values. Options turns flags into it, each component's part
// completed and checked by the component's own Options; tests may fill it
// in directly.
type Config struct {
	// ListenAddress is where the public API is served (host:port).
	ListenAddress string
	// DiagnosticsAddress is where probes, metrics and the status page are
	// served (host:port; internal/server/diagnostics), apart from the public API.
	DiagnosticsAddress string
	// Profiling serves Go's runtime profiles on the diagnostics address.
	Profiling bool
	// ExternalURL is nil when --external-url was not given: it is then
	// derived from the address the backend listens on (ExternalURLFor).
	ExternalURL *url.URL
	// Logger receives every log of the backend (default: discard).
	Logger *slog.Logger
	// Now is the clock of sessions (issue, expiry, pace, grace,
	// collection) and of the skew measurement (default time.Now).
	Now func() time.Time
	// PrettyName is the provider's name shown to consumers.
	PrettyName string

	SessionTTL   time.Duration
	PollInterval time.Duration
	GracePeriod  time.Duration
	// MaxPolledSessions bounds the sessions whose poll pace and nonces
	// a replica remembers (sessions.Limits).
	MaxPolledSessions int
	// SessionKeys derive session IDs and secrets (internal/sessions/sessionkey):
	// the first issues, all open. Empty: derived from the peer keys for the
	// ring, random for memory.
	SessionKeys [][]byte
	// MaxConnections and MaxConnsPerClient cap the public listener's
	// connections (0: no cap).
	MaxConnections    int
	MaxConnsPerClient int
	// SessionCreateRate paces POST /sessions per client, per second
	// (httpapi.Config.SessionCreateRate; 0: no limit).
	SessionCreateRate float64
	// ShutdownTimeout bounds the drain of in-flight requests (Run).
	ShutdownTimeout time.Duration

	TLSCertFile string
	TLSKeyFile  string

	// Store says where sessions live.
	Store StoreConfig

	// OIDC is the browser login: off unless OIDC.Enabled (then discovery,
	// sessions and polls still work, /authorize answers 503, and nothing
	// runs against the provider cluster).
	OIDC oidc.Options
	// Browser has the cookie keys (at least one of each when the browser
	// login is on) and the callback flow's settings.
	Browser browser.Options
	// ClusterKey derives cluster secrets (internal/sessions/clusterkey): the
	// first key issues them, all prove them (a rotation). At least one.
	ClusterKey clusterkey.Options
	// Provider is the provider cluster (internal/binding).
	Provider binding.Options
	// LongPoll: polls that ask to wait for their session's end.
	LongPoll longpoll.Options
	// CLITokens: the tokens of `kubectl bind login`.
	CLITokens clitoken.Options
	// Controllers: the provider-side controllers (credentials, garbage
	// collection, leader election).
	Controllers controllers.Options
}

// Session stores: one process (memory) or records in the provider cluster
// read through a groupcache ring of replicas (docs/sessions.md).
const (
	StoreMemory = "memory"
	StoreRing   = "ring"
	// storeRingDeprecated is the former name of StoreRing, still
	// accepted so that a deployment with old values starts.
	storeRingDeprecated = "hashring"
)

// StoreConfig is the session store configuration.
type StoreConfig struct {
	Kind string // StoreMemory or StoreRing
	// Deprecated says how the flags named the store by a name that is
	// going away ("": they did not); New warns with it.
	Deprecated string
	// WriteRate is the store's write budget per replica, records a
	// second (sessions.Limits.WriteRate; burst: WriteBurst).
	WriteRate float64
	// MaxRecords bounds the memory store's records.
	MaxRecords int

	// The rest is for the ring only.
	// Namespace holds the session records (the backend's own).
	Namespace         string
	PeerListenAddress string
	// PeerSelfURL is this replica's peer base URL as the others reach it.
	PeerSelfURL string
	// Peers is the static list of every replica's peer base URL (self
	// included); empty when discovery is used.
	Peers []string
	// PeerServiceNamespace/PeerServiceName: the headless Service whose
	// EndpointSlices list the replicas; empty without discovery.
	PeerServiceNamespace, PeerServiceName string
	PeerPortName                          string
	// PeerKeys authenticate peers over TLS (ring.Options.Keys): the first
	// signs this replica's certificate, all are trusted. Never logged.
	PeerKeys [][]byte
}

// ExternalURLFor returns the configured external URL, or one derived from
// the address the backend listens on (and whether it was derived).
func (c *Config) ExternalURLFor(listen net.Addr) (u *url.URL, derived bool) {
	if c.ExternalURL != nil {
		return c.ExternalURL, false
	}
	host, port, err := net.SplitHostPort(listen.String())
	if err != nil {
		host, port = "localhost", "8080"
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	scheme := "http"
	if c.TLSCertFile != "" {
		scheme = "https"
	}
	return &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, port)}, true
}

// callbackURL is the OIDC redirect URL for the external URL ext.
func (c *Config) callbackURL(ext *url.URL) string {
	if c.OIDC.CallbackURL != "" {
		return c.OIDC.CallbackURL
	}
	return ext.JoinPath("callback").String()
}
