package main

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/clitoken"
	"github.com/kbprovider/backend/internal/longpoll"
	"github.com/kbprovider/backend/internal/server"
)

// envPrefix: every flag --some-name can also be given as the environment
// variable KUBE_BIND_SOME_NAME (upper case, dashes become underscores). A
// flag on the command line wins over the environment, which wins over the
// default.
const envPrefix = "KUBE_BIND_"

// envName returns the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// noEnv lists flags that have no environment variable.
var noEnv = map[string]bool{"version": true, "help": true}

// config is the backend's validated configuration: what internal/server
// is built from, and what only this command uses.
type config struct {
	server.Config

	// CookieKeysGenerated says which keys were made up at random (one
	// key each) because none was configured (they differ per process and
	// per restart); ClusterSecretKeyGenerated likewise.
	CookieKeysGenerated       []string
	ClusterSecretKeyGenerated bool

	LogLevel  slog.Level
	LogFormat string // "json" or "text"

	ShowVersion bool

	// MemoryLimit is the container's memory limit in bytes (0: none); the
	// Go runtime's soft limit is set below it (memoryLimitShare).
	MemoryLimit int64
}

// rawFlags are the flag values as given, before validation.
type rawFlags struct {
	memoryLimit                                           string
	listenAddress, externalURL                            string
	diagnosticsAddress                                    string
	oidcIssuerURL, oidcClientID                           string
	oidcClientSecret, oidcClientSecretFile                string
	oidcCallbackURL, oidcAllowedUsers, oidcAllowedGroups  string
	cookieSigningKey, cookieSigningKeyFile                string
	cookieEncryptionKey, cookieEncryptionKeyFile          string
	clusterSecretKey, clusterSecretKeyFile                string
	credentials                                           credentialsFlags
	quota                                                 quotaFlags
	externalAddress, externalCAFile, externalServerName   string
	prettyName, namespacePrefix, consumerScope            string
	admissionPolicy                                       string
	unsafeSkipAdmissionPolicyCheck                        bool
	kubeconfig, kubeContext                               string
	sessionTTL, pollInterval, gracePeriod, shutdownTimout time.Duration
	maxPolledSessions                                     int
	longPollMaxWait                                       time.Duration
	maxLongPolls                                          int
	maxConnections, maxConnectionsPerClient               int
	sessionCreateRate                                     float64
	logLevel, logFormat                                   string
	tlsCertFile, tlsKeyFile                               string
	version                                               bool
	store                                                 storeFlags
	callbackAllowedURLs                                   string
	callbackFlow                                          bool
	leaderElection                                        bool
	leaderElectionNamespace, leaderElectionLeaseName      string
	podNamespace, podName                                 string
	gcUnusedBindingAfter                                  time.Duration
	gcDryRun                                              bool
	cliTokenTTL                                           time.Duration
	cliTokensNotBefore                                    string
}

func newFlagSet(r *rawFlags, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kube-bind-backend", flag.ContinueOnError)
	fs.SetOutput(out)
	s, d, i, b := fs.StringVar, fs.DurationVar, fs.IntVar, fs.BoolVar

	s(&r.listenAddress, "listen-address", ":8080", "address to serve HTTP(S) on (host:port)")
	s(&r.diagnosticsAddress, "diagnostics-address", "127.0.0.1:9090", "address (host:port) to serve /healthz, /readyz, /metrics and the status page /statusz on, for probes, Prometheus and the operator; loopback by default, the chart sets :<port> so that the kubelet and Prometheus reach it; never route it from the Internet (the public listener serves only a terse /healthz and /readyz)")
	s(&r.externalURL, "external-url", "", "public URL of the backend (scheme, host, optional path prefix); every advertised URL and every signature check uses it (default: http://<listen-address>, for local use only)")

	s(&r.oidcIssuerURL, "oidc-issuer-url", "", "issuer URL of the OpenID Connect provider users log in at")
	s(&r.oidcClientID, "oidc-issuer-client-id", "", "OAuth2 client ID of the backend at the OpenID Connect provider")
	s(&r.oidcClientSecret, "oidc-issuer-client-secret", "", "OAuth2 client secret (prefer --oidc-issuer-client-secret-file)")
	s(&r.oidcClientSecretFile, "oidc-issuer-client-secret-file", "", "file holding the OAuth2 client secret, e.g. a mounted Kubernetes Secret")
	s(&r.oidcCallbackURL, "oidc-callback-url", "", "redirect URL registered at the OpenID Connect provider (default: <external-url>/callback)")
	s(&r.oidcAllowedUsers, "oidc-allowed-users", "", "comma-separated subjects (preferred) or e-mail addresses allowed to bind; an address matches only when the ID token says email_verified: true (default: everybody the provider accepts)")
	s(&r.oidcAllowedGroups, "oidc-allowed-groups", "", "comma-separated groups whose members may bind (default: everybody the provider accepts)")

	s(&r.cookieSigningKey, "cookie-signing-key", "", "base64 key (32 or 64 bytes) signing cookies and login state; all replicas need the same; several keys (whitespace-separated): the first is current, the others are still accepted, a rotation (default: random per process)")
	s(&r.cookieSigningKeyFile, "cookie-signing-key-file", "", "file holding base64 cookie signing keys, one per line: the first is current, the others (a previous key during a rotation) are still accepted")
	s(&r.cookieEncryptionKey, "cookie-encryption-key", "", "base64 key (16, 24 or 32 bytes) encrypting cookies; all replicas need the same; several keys (whitespace-separated): the first is current, the others are still accepted, a rotation (default: random per process)")
	s(&r.cookieEncryptionKeyFile, "cookie-encryption-key-file", "", "file holding base64 cookie encryption keys, one per line: the first is current, the others (a previous key during a rotation) are still accepted")

	s(&r.clusterSecretKey, "cluster-secret-key", "", "base64 key (32 to 64 bytes) from which cluster secrets are derived; all replicas need the same, and it must survive restarts and upgrades; several keys (whitespace-separated): the first issues secrets, all prove them, a rotation (default: random per process)")
	s(&r.clusterSecretKeyFile, "cluster-secret-key-file", "", "file holding base64 cluster secret keys, one per line: the first issues cluster secrets, the others (previous keys during a rotation) still prove theirs")
	r.credentials.register(fs)
	r.quota.register(fs)

	s(&r.externalAddress, "external-address", "", "API server address put into issued kubeconfigs (default: the provider cluster's)")
	s(&r.externalCAFile, "external-ca-file", "", "PEM CA bundle put into issued kubeconfigs (default: the provider cluster's)")
	s(&r.externalServerName, "external-server-name", "", "TLS server name put into issued kubeconfigs")

	s(&r.prettyName, "pretty-name", "kube-bind provider", "provider name shown to consumers")
	s(&r.namespacePrefix, "namespace-prefix", "kube-bind-", "prefix of the provider namespaces made for consumers")
	s(&r.consumerScope, "consumer-scope", "Namespaced", "scope of resources consumers may bind: Namespaced or Cluster")
	s(&r.kubeconfig, "kubeconfig", "", "kubeconfig of the provider cluster (default: in-cluster configuration, else $KUBECONFIG)")
	s(&r.admissionPolicy, "admission-policy", "kube-bind-backend-scope", "name of the ValidatingAdmissionPolicy confining the backend to the namespaces it made (the chart's <release>-scope); at start the backend proves with dry-run requests that it is in force and refuses to start where it is not, and the leader checks again every 5 minutes")
	b(&r.unsafeSkipAdmissionPolicyCheck, "unsafe-skip-admission-policy-check", false, "UNSAFE: start without proving that --admission-policy confines the backend; without that policy whoever takes over the backend can grant itself Secrets and ServiceAccount tokens in any namespace and delete any namespace. Only for a backend that runs as a cluster admin anyway (local demos, tests)")
	s(&r.kubeContext, "context", "", "context of the kubeconfig to use (default: its current context)")

	d(&r.sessionTTL, "session-ttl", 10*time.Minute, "how long a binding session lives after creation")
	d(&r.pollInterval, "poll-interval", 2*time.Second, "poll interval advertised to clients and enforced (with a small jitter tolerance)")
	d(&r.gracePeriod, "grace-period", 60*time.Second, "how long a delivered BindingResponse stays available to further polls")
	i(&r.maxPolledSessions, "max-polled-sessions", 100000, "most sessions whose poll pace and nonces a replica remembers (about 40 MB at most); beyond it the least recently polled session is forgotten")
	d(&r.longPollMaxWait, "long-poll-max-wait", longpoll.DefaultMaxWait, "longest a poll that asks with \"Prefer: wait=N\" is held until its session ends (whole seconds, at most 50s); advertised in discovery as longPollMaxWait; 0 turns long polling off")
	i(&r.maxLongPolls, "max-long-polls", longpoll.DefaultMaxHeld, "most polls held open at once, per replica; beyond it a poll that asks to wait is answered at once")
	s(&r.memoryLimit, "memory-limit", "", "the container's memory limit, a byte count or quantity (256Mi); the Go runtime keeps its heap under 85% of it unless GOMEMLIMIT is set. The chart sets it from the container's limit")
	i(&r.maxConnections, "max-connections", 4096, "most connections served at once; beyond it a new one takes the place of an idle keep-alive connection or of one silent for 0.5s since it was accepted, else waits in the listen backlog (0: no limit). Keep it below the open-file limit (ulimit -n)")
	i(&r.maxConnectionsPerClient, "max-connections-per-client", 64, "most connections from one client IP address at once; more are closed at once (0: no limit). Behind a proxy that does not keep client addresses, every connection is the proxy's")
	fs.Float64Var(&r.sessionCreateRate, "session-create-rate", 10, "requests that create something for an anonymous caller (POST /sessions, /api/sessions; GET /authorize, /callback, /api/authorize, /) allowed per second per client (an IPv4 address, an IPv6 /64), one bucket, with a burst of three seconds' worth; more are answered 429 (0: no limit). Behind a proxy that does not keep client addresses every client shares the proxy's: raise it or set 0")
	d(&r.shutdownTimout, "shutdown-timeout", 25*time.Second, "how long in-flight requests may take to finish on SIGTERM")

	s(&r.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	s(&r.logFormat, "log-format", "json", "log format: json or text")
	s(&r.tlsCertFile, "tls-cert-file", "", "PEM certificate to serve HTTPS with (with --tls-key-file)")
	s(&r.tlsKeyFile, "tls-key-file", "", "PEM private key to serve HTTPS with (with --tls-cert-file)")

	r.store.register(fs)
	b(&r.callbackFlow, "callback-flow", true, "offer the callback flow (OAuth2CodeGrant) of released kubectl bind CLIs besides the poll flow; false: discovery offers the poll flow only and /authorize refuses callback links")
	s(&r.callbackAllowedURLs, "callback-allowed-urls", "", "comma-separated callback URLs (scheme://host[:port][/path], each matched exactly: no path below it, no query) the callback flow may redirect to, besides http URLs on a loopback host; not with --callback-flow=false")

	b(&r.leaderElection, "leader-election", true, "run the provider-side controllers on one replica at a time, holding a Lease; off when no namespace is known (no --leader-election-namespace, no POD_NAMESPACE, not in a pod)")
	s(&r.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: $POD_NAMESPACE, else the pod's own namespace)")
	s(&r.leaderElectionLeaseName, "leader-election-lease-name", "kube-bind-backend", "name of the leader election Lease")

	d(&r.gcUnusedBindingAfter, "gc-unused-binding-after", 24*time.Hour, "delete a consumer namespace left by a bind cut short, or by a bind whose response was never handed out, this long after it was made; never one whose konnector sent a heartbeat or whose credentials were used; 0 turns it off (at least 1h and longer than --session-ttl)")
	b(&r.gcDryRun, "gc-dry-run", false, "only log (and count) the unused bindings the garbage collection would delete")

	d(&r.cliTokenTTL, "cli-token-ttl", clitoken.DefaultTTL, "lifetime of the tokens `kubectl bind login` receives (15m to 24h); the CLI stops using one 5 minutes before it ends")
	s(&r.cliTokensNotBefore, "cli-tokens-not-before", "", "RFC 3339 time: CLI tokens issued before it are refused (raise it to revoke every token at once)")

	b(&r.version, "version", false, "print the version and exit")

	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kube-bind-backend [flags]\n\nEvery flag --some-name can also be set as environment variable %sSOME_NAME;\nthe command line wins over the environment.\n\nFlags:\n", envPrefix)
		fs.PrintDefaults()
	}
	return fs
}

// parseConfig reads flags from args and, for flags not on the command line,
// from the environment via getenv; then it validates the result. Errors
// name the flag (and the environment variable, where it came from there).
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (*config, error) {
	var r rawFlags
	fs := newFlagSet(&r, usage)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: all settings are flags", fs.Args())
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if onCommandLine[f.Name] || noEnv[f.Name] || envErr != nil {
			return
		}
		name := envName(f.Name)
		if v := getenv(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("invalid value %q for %s (--%s): %s", redactIfSecret(f.Name, v), name, f.Name, want(f, err))
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	if r.version {
		return &config{ShowVersion: true}, nil
	}
	r.store.podIP, r.store.podNamespace = getenv("POD_IP"), getenv("POD_NAMESPACE")
	r.podNamespace, r.podName = getenv("POD_NAMESPACE"), getenv("POD_NAME")
	return r.validate()
}

func redactIfSecret(flagName, v string) string {
	if strings.Contains(flagName, "secret") || strings.Contains(flagName, "key") && !strings.HasSuffix(flagName, "-file") {
		return "<redacted>"
	}
	return v
}

// want says what a flag's value should look like.
func want(f *flag.Flag, err error) string {
	switch f.Value.(flag.Getter).Get().(type) {
	case time.Duration:
		return "want a duration such as 30s, 2m or 1h30m"
	case int:
		return "want a whole number"
	case bool:
		return "want true or false"
	}
	return err.Error()
}

func (r *rawFlags) validate() (*config, error) {
	c := &config{Config: server.Config{
		ListenAddress:      r.listenAddress,
		DiagnosticsAddress: r.diagnosticsAddress,
		OIDCIssuerURL:      r.oidcIssuerURL,
		OIDCClientID:       r.oidcClientID,
		OIDCAllowedUsers:   splitList(r.oidcAllowedUsers),
		OIDCAllowedGroups:  splitList(r.oidcAllowedGroups),
		ExternalAddress:    r.externalAddress,
		ExternalServerName: r.externalServerName,
		PrettyName:         strings.TrimSpace(r.prettyName),
		NamespacePrefix:    r.namespacePrefix,
		AdmissionPolicy:    r.admissionPolicyToCheck(),
		Kubeconfig:         r.kubeconfig,
		Context:            r.kubeContext,
		SessionTTL:         r.sessionTTL,
		PollInterval:       r.pollInterval,
		GracePeriod:        r.gracePeriod,
		MaxPolledSessions:  r.maxPolledSessions,
		MaxConnections:     r.maxConnections,
		MaxConnsPerClient:  r.maxConnectionsPerClient,
		SessionCreateRate:  r.sessionCreateRate,
		ShutdownTimeout:    r.shutdownTimout,
		TLSCertFile:        r.tlsCertFile,
		TLSKeyFile:         r.tlsKeyFile,
	}}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	if _, _, err := net.SplitHostPort(r.listenAddress); err != nil {
		fail("--listen-address %q: want host:port, e.g. :8080 or 127.0.0.1:8080", r.listenAddress)
	}
	if _, port, err := net.SplitHostPort(r.diagnosticsAddress); err != nil {
		fail("--diagnostics-address %q: want host:port, e.g. :9090 or 127.0.0.1:9090", r.diagnosticsAddress)
	} else if _, public, err := net.SplitHostPort(r.listenAddress); err == nil && port == public && port != "0" {
		fail("--diagnostics-address %q: needs a port of its own, not the --listen-address port %s", r.diagnosticsAddress, public)
	}
	if r.externalURL != "" {
		u, err := parseHTTPURL(r.externalURL)
		if err != nil {
			fail("--external-url %q: %v; e.g. https://bind.example.com", r.externalURL, err)
		} else if u.RawQuery != "" || u.Fragment != "" {
			fail("--external-url %q: must not have a query or fragment", r.externalURL)
		} else {
			c.ExternalURL = u
		}
	}

	if r.oidcCallbackURL != "" {
		if _, err := parseHTTPURL(r.oidcCallbackURL); err != nil {
			fail("--oidc-callback-url %q: %v", r.oidcCallbackURL, err)
		}
		c.OIDCCallbackURL = r.oidcCallbackURL
	}
	secret, err := valueOrFile("oidc-issuer-client-secret", r.oidcClientSecret, r.oidcClientSecretFile)
	if err != nil {
		errs = append(errs, err)
	}
	c.OIDCClientSecret = secret
	if r.oidcIssuerURL != "" {
		if _, err := parseHTTPURL(r.oidcIssuerURL); err != nil {
			fail("--oidc-issuer-url %q: %v", r.oidcIssuerURL, err)
		}
		if r.oidcClientID == "" {
			fail("--oidc-issuer-client-id is required with --oidc-issuer-url")
		}
		if secret == "" {
			fail("--oidc-issuer-client-secret or --oidc-issuer-client-secret-file is required with --oidc-issuer-url")
		}
	}

	c.CookieSigningKeys, err = keyList("cookie-signing-key", r.cookieSigningKey, r.cookieSigningKeyFile, 32, 64)
	if err != nil {
		errs = append(errs, err)
	} else if c.CookieSigningKeys == nil {
		c.CookieSigningKeys = [][]byte{randomKey(32)}
		c.CookieKeysGenerated = append(c.CookieKeysGenerated, "cookie-signing-key")
	}
	c.CookieEncryptionKeys, err = keyList("cookie-encryption-key", r.cookieEncryptionKey, r.cookieEncryptionKeyFile, 16, 24, 32)
	if err != nil {
		errs = append(errs, err)
	} else if c.CookieEncryptionKeys == nil {
		c.CookieEncryptionKeys = [][]byte{randomKey(32)}
		c.CookieKeysGenerated = append(c.CookieKeysGenerated, "cookie-encryption-key")
	}

	c.ClusterSecretKeys, err = keyList("cluster-secret-key", r.clusterSecretKey, r.clusterSecretKeyFile, 32, 48, 64)
	if err != nil {
		errs = append(errs, err)
	} else if c.ClusterSecretKeys == nil {
		c.ClusterSecretKeys, c.ClusterSecretKeyGenerated = [][]byte{randomKey(32)}, true
	}
	var credErrs []error
	c.Credentials, credErrs = r.credentials.validate()
	errs = append(errs, credErrs...)
	if c.ConsumerQuota, err = r.quota.validate(); err != nil {
		errs = append(errs, err)
	}

	if r.externalCAFile != "" {
		b, err := os.ReadFile(r.externalCAFile)
		if err == nil {
			err = binding.CheckCABundle(b)
		}
		if err != nil {
			fail("--external-ca-file %s: %v", r.externalCAFile, err)
		} else {
			c.ExternalCA = b
		}
	}
	if r.externalAddress != "" {
		if u, err := url.Parse(r.externalAddress); err != nil || u.Scheme != "https" || u.Host == "" {
			fail("--external-address %q: want the https URL of the provider's API server, e.g. https://api.example.com:6443", r.externalAddress)
		}
	}

	if c.PrettyName == "" {
		fail("--pretty-name must not be empty")
	}
	if err := binding.ValidatePrefix(r.namespacePrefix); err != nil {
		fail("--namespace-prefix: %v", err)
	}
	if msgs := validation.IsDNS1123Subdomain(r.admissionPolicy); !r.unsafeSkipAdmissionPolicyCheck && len(msgs) > 0 {
		fail("--admission-policy %q: %s", r.admissionPolicy, strings.Join(msgs, "; "))
	}
	if c.ConsumerScope, err = binding.ParseScope(r.consumerScope); err != nil {
		fail("--consumer-scope: %v", err)
	}

	if r.sessionTTL <= 0 {
		fail("--session-ttl %s: must be positive", r.sessionTTL)
	}
	if err := clitoken.ValidateTTL(r.cliTokenTTL); err != nil {
		fail("--cli-token-ttl: %v", err)
	}
	c.CLITokenTTL = r.cliTokenTTL
	if r.cliTokensNotBefore != "" {
		t, err := time.Parse(time.RFC3339, r.cliTokensNotBefore)
		if err != nil {
			fail("--cli-tokens-not-before %q: want an RFC 3339 time such as 2026-11-26T10:00:00Z", r.cliTokensNotBefore)
		}
		c.CLITokensNotBefore = t
	}
	if r.pollInterval <= 0 {
		fail("--poll-interval %s: must be positive", r.pollInterval)
	} else if r.sessionTTL > 0 && r.pollInterval >= r.sessionTTL {
		fail("--poll-interval %s: must be shorter than --session-ttl %s", r.pollInterval, r.sessionTTL)
	}
	if r.gracePeriod <= 0 {
		fail("--grace-period %s: must be positive", r.gracePeriod)
	}
	if r.maxConnections < 0 {
		fail("--max-connections %d: must be 0 (no limit) or positive", r.maxConnections)
	}
	if r.maxConnectionsPerClient < 0 {
		fail("--max-connections-per-client %d: must be 0 (no limit) or positive", r.maxConnectionsPerClient)
	}
	if !(r.sessionCreateRate >= 0) || math.IsInf(r.sessionCreateRate, 0) {
		fail("--session-create-rate %v: must be 0 (no limit) or positive", r.sessionCreateRate)
	}
	if r.maxPolledSessions <= 0 || r.maxPolledSessions > maxPolledSessionsBound {
		fail("--max-polled-sessions %d: must be positive and at most %d", r.maxPolledSessions, maxPolledSessionsBound)
	}
	c.LongPoll = longpoll.Options{MaxWait: r.longPollMaxWait, MaxHeld: r.maxLongPolls}
	errs = append(errs, c.LongPoll.Validate()...)
	if r.shutdownTimout <= 0 {
		fail("--shutdown-timeout %s: must be positive", r.shutdownTimout)
	}

	if err := c.LogLevel.UnmarshalText([]byte(r.logLevel)); err != nil || !oneOf(strings.ToLower(r.logLevel), "debug", "info", "warn", "error") {
		fail("--log-level %q: want debug, info, warn or error", r.logLevel)
	}
	c.LogFormat = strings.ToLower(r.logFormat)
	if !oneOf(c.LogFormat, "json", "text") {
		fail("--log-format %q: want json or text", r.logFormat)
	}

	if (r.tlsCertFile == "") != (r.tlsKeyFile == "") {
		fail("--tls-cert-file and --tls-key-file go together")
	}
	for _, f := range []string{r.tlsCertFile, r.tlsKeyFile} {
		if f != "" {
			if _, err := os.Stat(f); err != nil {
				fail("TLS: %v", err)
			}
		}
	}
	var storeErrs []error
	c.Store, storeErrs = r.store.validate()
	errs = append(errs, storeErrs...)
	c.CallbackAllowList, storeErrs = validateCallbackAllowList(r.callbackAllowedURLs)
	errs = append(errs, storeErrs...)
	c.NoCallbackFlow = !r.callbackFlow
	if c.NoCallbackFlow && len(c.CallbackAllowList) > 0 {
		fail("--callback-allowed-urls with --callback-flow=false: the allow-list is for the callback flow; drop one")
	}
	errs = append(errs, r.validateLeaderElection(c)...)
	errs = append(errs, r.validateGC(c)...)
	if r.memoryLimit != "" {
		q, err := resource.ParseQuantity(r.memoryLimit)
		if err != nil || q.Value() < 32<<20 {
			fail("--memory-limit %q: must be a quantity of at least 32Mi, e.g. 256Mi", r.memoryLimit)
		} else {
			c.MemoryLimit = q.Value()
		}
	}
	return c, errors.Join(errs...)
}

func parseHTTPURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("must be an absolute http:// or https:// URL")
	}
	if u.User != nil {
		return nil, errors.New("must not carry user information")
	}
	return u, nil
}

// valueOrFile returns the value of --name or the trimmed content of
// --name-file; giving both is an error.
func valueOrFile(name, value, file string) (string, error) {
	if value != "" && file != "" {
		return "", fmt.Errorf("--%s and --%s-file: give only one", name, name)
	}
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s-file: %v", name, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("--%s-file %s is empty", name, file)
	}
	return v, nil
}

// maxPolledSessionsBound bounds --max-polled-sessions: beyond it the
// nonce bound of the admission table decides anyway.
const maxPolledSessionsBound = 10_000_000

// keyList decodes the keys of --name (or --name-file): base64 keys
// (standard or URL alphabet, padded or not) separated by white space, one
// per line in a file, each of one of the given lengths. The first is the
// current key, the others are previous ones (a rotation). nil when none
// is configured. Errors name the key's position when there are several,
// never its value.
func keyList(name, value, file string, lengths ...int) ([][]byte, error) {
	v, err := valueOrFile(name, value, file)
	if err != nil || v == "" {
		return nil, err
	}
	fields := strings.Fields(v)
	var keys [][]byte
	var errs []error
	for i, f := range fields {
		which, notBase64 := "", "not base64"
		if len(fields) > 1 {
			which = fmt.Sprintf("key %d ", i+1)
			notBase64 = which + "is not base64"
		}
		key, ok := decodeBase64(f)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("--%s: %s; make one with: openssl rand -base64 32", name, notBase64))
		case !slices.Contains(lengths, len(key)):
			errs = append(errs, fmt.Errorf("--%s: %sdecodes to %d bytes, want %s", name, which, len(key), joinInts(lengths)))
		default:
			keys = append(keys, key)
		}
	}
	if len(errs) > 0 {
		// openssl rand -base64 64 breaks its output over two lines.
		if whole, ok := decodeBase64(strings.Join(fields, "")); len(fields) > 1 && ok && slices.Contains(lengths, len(whole)) {
			errs = append(errs, fmt.Errorf("--%s: one key per line; is a key broken over several lines? Make one with: openssl rand -base64 %d | tr -d '\\n'", name, len(whole)))
		}
		return nil, errors.Join(errs...)
	}
	return keys, nil
}

func randomKey(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func oneOf(s string, options ...string) bool {
	for _, o := range options {
		if s == o {
			return true
		}
	}
	return false
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, " or ")
}

// admissionPolicyToCheck is the policy the server proves at start, "" when
// the operator chose to run unconfined.
func (r *rawFlags) admissionPolicyToCheck() string {
	if r.unsafeSkipAdmissionPolicyCheck {
		return ""
	}
	return r.admissionPolicy
}
