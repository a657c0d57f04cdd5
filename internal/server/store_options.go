package server

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kbprovider/backend/internal/flagvalue"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// storeFlags are the session store's flags as given.
type storeFlags struct {
	kind                           string
	peerListenAddress, peerSelfURL string
	peers, peerService, peerPort   string
	peerKey, peerKeyFile           string
	namespace                      string
	writeRate                      float64
	maxRecords                     int
}

func (r *storeFlags) addFlags(fs *pflag.FlagSet) {
	s := fs.StringVar
	s(&r.kind, "session-store", StoreMemory, "where sessions live: memory (one replica, lost on restart) or ring (records in the provider cluster, read by every replica; sessions placed on the replicas with groupcache; see docs/sessions.md)")
	s(&r.namespace, "session-namespace", "", "ring: namespace of the session records (Secrets; default: $POD_NAMESPACE)")
	s(&r.peerListenAddress, "peer-listen-address", "", "ring: address (host:port, fixed port) to serve the peer API on, never the public one, e.g. :8091")
	s(&r.peerSelfURL, "peer-self-url", "", "ring: this replica's peer URL as the other replicas reach it (default: https://$POD_IP:<peer port> when POD_IP is set, else https://<peer-listen-address host>:<port>)")
	s(&r.peers, "peers", "", "ring: comma-separated peer URLs of every replica, this one included (a static ring; or use --peer-service)")
	s(&r.peerService, "peer-service", "", "ring: namespace/name of the headless Service whose EndpointSlices list the replicas (the ring follows replicas that come and go)")
	s(&r.peerPort, "peer-port-name", "", "ring: name of the peer port in --peer-service's EndpointSlices (default: their only port)")
	s(&r.peerKey, "peer-key", "", "ring: base64 key of at least 32 bytes from which the peers' TLS identity and the session keys are derived; the same on every replica (prefer --peer-key-file)")
	fs.Float64Var(&r.writeRate, "session-write-rate", sessions.DefaultLimits.WriteRate, "session records (outcomes, deliveries, single-use marks) this replica may write per second, with a burst of two seconds' worth; past it a write fails at once and its request gets 503 with Retry-After, nothing queues. With ring each replica has its own budget: the provider cluster gets at most replicas × rate")
	fs.IntVar(&r.maxRecords, "session-max-records", sessions.DefaultLimits.MaxRecords, "memory: most session records kept (each lives a session's TTL plus the grace period); past it a write fails with 503 and Retry-After")
	s(&r.peerKeyFile, "peer-key-file", "", "ring: file holding base64 peer keys, one per line, e.g. a mounted Kubernetes Secret: the first is current, the others (a previous key during a rotation) are still trusted")
}

// complete checks the store flags; errors name the flag. podIP and
// podNamespace (from the environment) give the defaults of the self URL
// and the namespace.
func (r *storeFlags) complete(podIP, podNamespace string) (StoreConfig, []error) {
	var c StoreConfig
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	if !(r.writeRate > 0) || r.writeRate > maxWriteRate {
		fail("--session-write-rate %v: must be positive and at most %d", r.writeRate, maxWriteRate)
	}
	c.WriteRate = r.writeRate
	if r.maxRecords <= 0 || r.maxRecords > maxRecordsBound {
		fail("--session-max-records %d: must be positive and at most %d", r.maxRecords, maxRecordsBound)
	}
	c.MaxRecords = r.maxRecords

	c.Kind = strings.ToLower(strings.TrimSpace(r.kind))
	if c.Kind == storeRingDeprecated {
		c.Kind = StoreRing
		c.Deprecated = "--session-store=hashring is deprecated: it is --session-store=ring"
	}
	switch c.Kind {
	case StoreMemory:
		for _, f := range [][2]string{
			{"peer-listen-address", r.peerListenAddress}, {"peer-self-url", r.peerSelfURL}, {"peers", r.peers},
			{"peer-service", r.peerService}, {"peer-port-name", r.peerPort}, {"peer-key", r.peerKey}, {"peer-key-file", r.peerKeyFile},
			{"session-namespace", r.namespace},
		} {
			if f[1] != "" {
				fail("--%s: only used with --session-store=ring", f[0])
			}
		}
		return c, errs
	case StoreRing:
	default:
		fail("--session-store %q: want memory or ring", r.kind)
		return c, errs
	}

	switch c.Namespace = r.namespace; {
	case c.Namespace == "":
		c.Namespace = podNamespace
		if c.Namespace == "" {
			fail("--session-namespace is required with --session-store=ring outside a pod (no POD_NAMESPACE)")
		}
	case !dnsLabel(c.Namespace):
		fail("--session-namespace %q: want a namespace name", r.namespace)
	}

	// The peer listener needs a fixed port: the others find this replica by it.
	host, port, err := net.SplitHostPort(r.peerListenAddress)
	switch {
	case r.peerListenAddress == "":
		fail("--peer-listen-address is required with --session-store=ring, e.g. :8091")
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
	case podIP != "":
		if net.ParseIP(podIP) == nil {
			fail("POD_IP %q is not an IP address; set --peer-self-url", podIP)
		} else {
			c.PeerSelfURL = "https://" + net.JoinHostPort(podIP, port)
		}
	case host == "" || isUnspecified(host):
		fail("--peer-self-url is required: --peer-listen-address %q names no host the other replicas could reach, and POD_IP is not set", r.peerListenAddress)
	default:
		c.PeerSelfURL = "https://" + net.JoinHostPort(host, port)
	}

	if r.peers != "" && r.peerService != "" {
		fail("--peers and --peer-service: give only one (a static ring or discovery)")
	}
	for _, p := range flagvalue.List(r.peers) {
		u, err := parsePeerURL(p)
		if err != nil {
			fail("--peers: %q: %v", p, err)
			continue
		}
		c.Peers = append(c.Peers, u)
	}
	if len(c.Peers) > 0 && c.PeerSelfURL != "" && !slices.Contains(c.Peers, c.PeerSelfURL) {
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

	keys, err := flagvalue.ValueOrFile("peer-key", r.peerKey, r.peerKeyFile)
	if err != nil {
		errs = append(errs, err)
	} else if keys == "" {
		fail("--peer-key-file (or --peer-key) is required with --session-store=ring; make one with: openssl rand -base64 32")
	}
	for i, key := range strings.Fields(keys) {
		b, ok := flagvalue.DecodeBase64(key)
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

// Bounds of --session-write-rate and --session-max-records: beyond them
// the budget bounds nothing a provider cluster or a process could hold.
const (
	maxWriteRate    = 10_000
	maxRecordsBound = 10_000_000
)

// WriteBurst is the burst of the write budget: two seconds' worth.
func (c StoreConfig) WriteBurst() int {
	return max(1, int(math.Ceil(2*c.WriteRate)))
}

// parsePeerURL accepts a peer base URL: https://host:port, nothing more,
// and returns it in the form the ring compares (no trailing slash).
func parsePeerURL(raw string) (string, error) {
	u, err := flagvalue.HTTPURL(raw)
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

// validPort: a port number of at most five digits, 1 to 65535; no sign
// (Atoi takes "+8091", which makes a peer URL no replica can parse).
func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return err == nil && n > 0 && len(p) <= 5
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

// dnsLabel: a Kubernetes namespace or Service name.
func dnsLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }
