package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/server"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// storeFlags are the session store flags as given.
type storeFlags struct {
	kind                           string
	peerListenAddress, peerSelfURL string
	peers, peerService, peerPort   string
	peerKey, peerKeyFile           string
	namespace                      string
	podIP                          string // from the environment (POD_IP), for the default self URL
	podNamespace                   string // from the environment (POD_NAMESPACE), the default namespace
}

func (r *storeFlags) register(fs *flag.FlagSet) {
	s := fs.StringVar
	s(&r.kind, "session-store", server.StoreMemory, "where sessions live: memory (one replica, lost on restart) or hashring (records in the provider cluster, read by every replica; sessions placed on the replicas with groupcache; see docs/sessions.md)")
	s(&r.namespace, "session-namespace", "", "hashring: namespace of the session records (Secrets; default: $POD_NAMESPACE)")
	s(&r.peerListenAddress, "peer-listen-address", "", "hashring: address (host:port, fixed port) to serve the peer API on, never the public one, e.g. :8091")
	s(&r.peerSelfURL, "peer-self-url", "", "hashring: this replica's peer URL as the other replicas reach it (default: https://$POD_IP:<peer port> when POD_IP is set, else https://<peer-listen-address host>:<port>)")
	s(&r.peers, "peers", "", "hashring: comma-separated peer URLs of every replica, this one included (a static ring; or use --peer-service)")
	s(&r.peerService, "peer-service", "", "hashring: namespace/name of the headless Service whose EndpointSlices list the replicas (the ring follows replicas that come and go)")
	s(&r.peerPort, "peer-port-name", "", "hashring: name of the peer port in --peer-service's EndpointSlices (default: their only port)")
	s(&r.peerKey, "peer-key", "", "hashring: base64 key of at least 32 bytes from which the peers' TLS identity and the session keys are derived; the same on every replica (prefer --peer-key-file)")
	s(&r.peerKeyFile, "peer-key-file", "", "hashring: file holding base64 peer keys, one per line, e.g. a mounted Kubernetes Secret: the first is current, the others (a previous key during a rotation) are still trusted")
}

// validate checks the store flags; errors name the flag.
func (r *storeFlags) validate() (server.StoreConfig, []error) {
	var c server.StoreConfig
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	c.Kind = strings.ToLower(strings.TrimSpace(r.kind))
	switch c.Kind {
	case server.StoreMemory:
		for _, f := range [][2]string{
			{"peer-listen-address", r.peerListenAddress}, {"peer-self-url", r.peerSelfURL}, {"peers", r.peers},
			{"peer-service", r.peerService}, {"peer-port-name", r.peerPort}, {"peer-key", r.peerKey}, {"peer-key-file", r.peerKeyFile},
			{"session-namespace", r.namespace},
		} {
			if f[1] != "" {
				fail("--%s: only used with --session-store=hashring", f[0])
			}
		}
		return c, errs
	case server.StoreHashring:
	default:
		fail("--session-store %q: want memory or hashring", r.kind)
		return c, errs
	}

	switch c.Namespace = r.namespace; {
	case c.Namespace == "":
		c.Namespace = r.podNamespace
		if c.Namespace == "" {
			fail("--session-namespace is required with --session-store=hashring outside a pod (no POD_NAMESPACE)")
		}
	case !dnsLabel(c.Namespace):
		fail("--session-namespace %q: want a namespace name", r.namespace)
	}

	// The peer listener needs a fixed port: the others find this replica by it.
	host, port, err := net.SplitHostPort(r.peerListenAddress)
	switch {
	case r.peerListenAddress == "":
		fail("--peer-listen-address is required with --session-store=hashring, e.g. :8091")
	case err != nil:
		fail("--peer-listen-address %q: want host:port, e.g. :8091", r.peerListenAddress)
	case port == "0" || !validPort(port):
		fail("--peer-listen-address %q: want a fixed port number, e.g. :8091 (the other replicas reach this one by it)", r.peerListenAddress)
	case host != "" && net.ParseIP(host) == nil && !dnsName(host):
		// The self URL may be made from this host: it must be one.
		fail("--peer-listen-address %q: want an IP address or a DNS name as the host, or none", r.peerListenAddress)
	default:
		c.PeerListenAddress = r.peerListenAddress
	}

	switch {
	case r.peerSelfURL != "":
		u, err := parsePeerURL(r.peerSelfURL)
		if err != nil {
			fail("--peer-self-url %q: %v", r.peerSelfURL, err)
		} else {
			c.PeerSelfURL = u
		}
	case c.PeerListenAddress == "":
		// Already reported.
	case r.podIP != "":
		if net.ParseIP(r.podIP) == nil {
			fail("POD_IP %q is not an IP address; set --peer-self-url", r.podIP)
		} else {
			c.PeerSelfURL = "https://" + net.JoinHostPort(r.podIP, port)
		}
	case host == "" || isUnspecified(host):
		fail("--peer-self-url is required: --peer-listen-address %q names no host the other replicas could reach, and POD_IP is not set", r.peerListenAddress)
	default:
		c.PeerSelfURL = "https://" + net.JoinHostPort(host, port)
	}

	if r.peers != "" && r.peerService != "" {
		fail("--peers and --peer-service: give only one (a static ring or discovery)")
	}
	for _, p := range splitList(r.peers) {
		u, err := parsePeerURL(p)
		if err != nil {
			fail("--peers: %q: %v", p, err)
			continue
		}
		c.Peers = append(c.Peers, u)
	}
	if len(c.Peers) > 0 && c.PeerSelfURL != "" && !containsString(c.Peers, c.PeerSelfURL) {
		fail("--peers must list this replica's own peer URL %s (--peer-self-url) exactly as the others do: every replica needs the same list", c.PeerSelfURL)
	}
	if r.peerService != "" {
		ns, name, ok := strings.Cut(r.peerService, "/")
		if !ok || !dnsLabel(ns) || !dnsLabel(name) {
			fail("--peer-service %q: want namespace/name of a Service, e.g. kube-bind/kube-bind-backend-peers", r.peerService)
		} else {
			c.PeerServiceNamespace, c.PeerServiceName = ns, name
		}
	}
	if r.peerPort != "" && r.peerService == "" {
		fail("--peer-port-name: only used with --peer-service")
	}
	c.PeerPortName = r.peerPort

	keys, err := valueOrFile("peer-key", r.peerKey, r.peerKeyFile)
	if err != nil {
		errs = append(errs, err)
	} else if keys == "" {
		fail("--peer-key-file (or --peer-key) is required with --session-store=hashring; make one with: openssl rand -base64 32")
	}
	for i, key := range strings.Fields(keys) {
		b, ok := decodeBase64(key)
		switch {
		case !ok:
			fail("--peer-key: key %d is not base64; make one with: openssl rand -base64 32", i+1)
		case len(b) < sessionkey.MinKeyLen:
			fail("--peer-key: key %d decodes to %d bytes, want at least %d", i+1, len(b), sessionkey.MinKeyLen)
		default:
			c.PeerKeys = append(c.PeerKeys, b)
		}
	}
	return c, errs
}

// parsePeerURL accepts a peer base URL: https://host:port, nothing more,
// and returns it in the form the ring compares (no trailing slash).
func parsePeerURL(raw string) (string, error) {
	u, err := parseHTTPURL(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "https" {
		return "", fmt.Errorf("want https: peers talk TLS, with certificates derived from the peer key")
	}
	if strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("want scheme://host:port only, no path or query")
	}
	if u.Port() == "" {
		return "", fmt.Errorf("want an explicit port, e.g. https://10.0.0.5:8091")
	}
	// The host must be an IP address or a DNS name as it is: the URL
	// parser also takes percent-escapes in a host, which would decode into
	// a peer URL that no replica can parse back.
	if host := u.Hostname(); net.ParseIP(host) == nil && !dnsName(host) {
		return "", fmt.Errorf("want an IP address or a DNS name as the host, not %q", host)
	}
	if !validPort(u.Port()) {
		return "", fmt.Errorf("want a port of digits only, 1 to 65535")
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host}).String(), nil
}

func decodeBase64(s string) ([]byte, bool) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, true
		}
	}
	return nil, false
}

// validPort: decimal digits only, 1 to 65535 (Atoi alone takes "+8091",
// which makes a peer URL no replica can parse).
func validPort(p string) bool {
	if p == "" || len(p) > 5 || strings.Trim(p, "0123456789") != "" {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

func isUnspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// dnsName: a host name of RFC 1123 labels (any case), at most 253
// characters, an optional final dot.
func dnsName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(strings.ToLower(s), ".") {
		if !dnsLabel(l) {
			return false
		}
	}
	return true
}

// dnsLabel: a Kubernetes namespace or Service name (RFC 1123 label).
func dnsLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// validateCallbackAllowList checks --callback-allowed-urls the way the
// browser handler reads it (browser.ParseCallbackAllowList).
func validateCallbackAllowList(raw string) ([]string, []error) {
	entries := splitList(raw)
	_, errs := browser.ParseCallbackAllowList(entries)
	for i, err := range errs {
		errs[i] = fmt.Errorf("--callback-allowed-urls: %w", err)
	}
	return entries, errs
}
