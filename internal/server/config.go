package server

import (
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/credentials"
	"github.com/kbprovider/backend/internal/longpoll"
)

// Config is everything the backend is built from: plain, already
// validated values (cmd/backend turns flags and the environment into it,
// asking each component to validate its part). The comments name the
// flags; docs/configuration.md says what they do.
type Config struct {
	// ListenAddress is where the public API is served (host:port).
	ListenAddress string
	// DiagnosticsAddress is where probes, metrics and the status page are
	// served (host:port; internal/diagnostics), apart from the public API.
	DiagnosticsAddress string
	// ExternalURL is nil when --external-url was not given: it is then
	// derived from the address the backend listens on (ExternalURLFor).
	ExternalURL *url.URL
	// Logger receives every log of the backend (default: discard).
	Logger *slog.Logger

	// The browser login: off unless OIDCIssuerURL and OIDCClientID are
	// set (then discovery, sessions and polls still work, /authorize
	// answers 503, and nothing runs against the provider cluster).
	OIDCIssuerURL     string
	OIDCClientID      string
	OIDCClientSecret  string
	OIDCCallbackURL   string // "" = <external URL>/callback
	OIDCAllowedUsers  []string
	OIDCAllowedGroups []string
	// CookieSigningKeys sign the login state and authenticate the login
	// cookie (at least 32 bytes each); CookieEncryptionKeys encrypt the
	// login cookie (16, 24 or 32 bytes each). The first of each list is
	// current, the others (a rotation) are still accepted: a cookie made
	// with any signing key and any encryption key listed opens. At least
	// one of each when the browser login is on.
	CookieSigningKeys    [][]byte
	CookieEncryptionKeys [][]byte
	// CallbackAllowList: callback URLs a callback-flow u may be, exactly
	// (checked with browser.ParseCallbackAllowList). Empty when
	// NoCallbackFlow is set.
	CallbackAllowList []string
	// NoCallbackFlow (--callback-flow=false): discovery offers the poll
	// flow only and /authorize refuses callback links.
	NoCallbackFlow bool

	// ClusterSecretKeys derive cluster secrets (internal/clusterkey): the
	// first issues them, all prove them (a rotation). At least one.
	ClusterSecretKeys [][]byte

	// Consumer credentials (internal/credentials; checked with
	// Policy.Validate).
	Credentials credentials.Policy

	// ConsumerQuota caps the objects each consumer creates (checked with
	// binding.Quota.Validate).
	ConsumerQuota binding.Quota

	// The provider cluster (internal/binding).
	Kubeconfig         string
	Context            string
	ExternalAddress    string
	ExternalCA         []byte // the content of --external-ca-file
	ExternalServerName string
	PrettyName         string
	NamespacePrefix    string        // checked with binding.ValidatePrefix
	ConsumerScope      binding.Scope // from binding.ParseScope
	// AdmissionPolicy names the ValidatingAdmissionPolicy that confines the
	// backend to the namespaces it made: with it set, the backend refuses to
	// start where dry-run probes show no such confinement, and the leader
	// probes again periodically (internal/scopecheck). "" checks nothing.
	AdmissionPolicy string

	// LongPoll: polls that ask to wait for their session's end
	// (--long-poll-max-wait, --max-long-polls; checked with
	// longpoll.Options.Validate).
	LongPoll longpoll.Options

	SessionTTL   time.Duration
	PollInterval time.Duration
	GracePeriod  time.Duration
	// MaxPolledSessions bounds the sessions whose poll pace and nonces
	// a replica remembers (sessions.Limits).
	MaxPolledSessions int
	// SessionKeys derive session IDs and secrets (internal/sessions/sessionkey):
	// the first issues, all open. Empty: derived from the peer keys for the
	// hashring, random for memory.
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

	// Leader election of the provider-side controllers: on when
	// LeaderElection is set (with a namespace).
	LeaderElection          bool
	LeaderElectionNamespace string
	LeaderElectionLeaseName string
	PodName                 string

	// Garbage collection of unused bindings (internal/cleanup): off when
	// GCUnusedBindingAfter is 0.
	GCUnusedBindingAfter time.Duration
	GCDryRun             bool

	// CLITokenTTL is the life of a `kubectl bind login` token
	// (--cli-token-ttl; 0: clitoken.DefaultTTL; checked with
	// clitoken.ValidateTTL); tokens issued before CLITokensNotBefore are
	// refused (--cli-tokens-not-before; zero: none).
	CLITokenTTL        time.Duration
	CLITokensNotBefore time.Time
}

// Session stores: one process (memory) or records in the provider cluster
// read through a groupcache hashring of replicas (docs/sessions.md).
const (
	StoreMemory   = "memory"
	StoreHashring = "hashring"
)

// StoreConfig is the session store configuration.
type StoreConfig struct {
	Kind string // StoreMemory or StoreHashring

	// The rest is for the hashring only.
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
	if c.OIDCCallbackURL != "" {
		return c.OIDCCallbackURL
	}
	return ext.JoinPath("callback").String()
}
