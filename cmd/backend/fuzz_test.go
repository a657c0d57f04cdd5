package main

import (
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/server"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil/certs"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzParseConfig: the backend's flags and environment. args are command
// line arguments, one per line; env is NAME=value lines. Files named by
// the *-file flags must be plain names: the target runs in a folder
// holding files of every kind a flag reads (no other file is opened).
//
// Properties: an accepted configuration holds only what its owners
// accept (the namespace prefix for binding, the allow-list for the
// browser handler, peer URLs in the form the ring compares, a peer port
// the peers can reach, keys of the right length); secret values never
// appear in an error; and giving the command line's flags through the
// environment instead changes nothing (both accepted, equally).
func FuzzParseConfig(f *testing.F) {
	dir := f.TempDir()
	pair := certs.NewServingPair(f, "fuzz")
	for name, content := range map[string]string{
		"secret": "s3cret\n",
		"sign":   base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", 32))) + "\n",
		"enc":    base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("e", 16))),
		"peer":   base64.StdEncoding.EncodeToString([]byte(strings.Repeat("p", 48))),
		// Rotations: two keys, the current first; a short second key.
		"sign2":     base64.StdEncoding.EncodeToString([]byte(strings.Repeat("S", 64))) + "\n" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", 32))) + "\n",
		"cluster2":  base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("C", 48))) + "\r\n" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("c", 32))),
		"short2":    base64.StdEncoding.EncodeToString([]byte(strings.Repeat("e", 16))) + "\n" + base64.StdEncoding.EncodeToString([]byte("short")),
		"short":     base64.StdEncoding.EncodeToString([]byte("short")),
		"empty":     "",
		"ca.pem":    string(pair.CertPEM),
		"tls.crt":   string(pair.CertPEM),
		"tls.key":   string(pair.KeyPEM),
		"notpem":    "hello",
		"notbase64": "!!!",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			f.Fatal(err)
		}
	}
	f.Chdir(dir)

	for _, s := range []struct{ args, env string }{
		{"", ""},
		{"--external-url=https://bind.example.com/kb/\n--oidc-issuer-url=https://idp.example.com\n--oidc-issuer-client-id=backend\n--oidc-issuer-client-secret-file=secret\n--cookie-signing-key-file=sign\n--cookie-encryption-key-file=enc", ""},
		{"--session-store=ring\n--peer-listen-address=10.0.0.5:8091\n--peers=https://10.0.0.5:8091,https://10.0.0.6:8091\n--peer-key-file=peer\n--session-namespace=kube-bind", ""},
		// A sign in the peer port: Atoi accepts it, and the peer URL
		// http://10.0.0.5:+8091 would be one no replica can parse.
		{"--session-store=ring\n--peer-listen-address=10.0.0.5:+8091\n--peer-key-file=peer", ""},
		{"--session-store=ring\n--peer-listen-address=:8091\n--peer-service=kube-bind/peers\n--peer-port-name=peer", "KUBE_BIND_PEER_KEY=" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))) + "\nPOD_IP=10.0.0.9\nPOD_NAMESPACE=kube-bind"},
		{"--session-store=ring\n--peer-listen-address=:8091\n--peer-self-url=https://peer.example.com:443/", "KUBE_BIND_PEER_KEY_FILE=short"},
		{"--callback-allowed-urls=https://cli.example.com/kube-bind, http://10.0.0.7:8000\n--namespace-prefix=tenant-", ""},
		{"--callback-allowed-urls=https://u@cli.example.com/?q\n--namespace-prefix=Kube_", ""},
		{"--callback-flow=false\n--callback-allowed-urls=https://cli.example.com/cb", ""},
		{"--tls-cert-file=tls.crt\n--tls-key-file=tls.key\n--external-ca-file=ca.pem\n--external-address=https://api.example.com:6443", ""},
		{"--poll-interval=20m\n--session-ttl=10m\n--log-level=DEBUG\n--log-format=Text\n--consumer-scope=cluster", "KUBE_BIND_MAX_POLLED_SESSIONS=5"},
		{"--cookie-signing-key=c2hvcnQ", "KUBE_BIND_COOKIE_ENCRYPTION_KEY=topsecretvalue"},
		{"--cookie-signing-key-file=sign2\n--cluster-secret-key-file=cluster2", "KUBE_BIND_COOKIE_ENCRYPTION_KEY=" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("e", 32))) + " " + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("E", 24)))},
		{"--cookie-encryption-key-file=short2", "KUBE_BIND_CLUSTER_SECRET_KEY=" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("c", 32))) + " topsecretvalue"},
		{"--leader-election-namespace=kube-bind\n--leader-election-lease-name=Bad_Name", "POD_NAME=backend-0"},
		{"--version", ""},
		{"--help", ""},
		{"stray", "KUBE_BIND_SESSION_TTL=soon"},
	} {
		f.Add(s.args, s.env)
	}
	key, err := clusterkey.New(make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	keys, err := sessionkey.New(make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	svc, err := lifecycle.New(lifecycle.Config{Store: memory.New(sessions.DefaultLimits, nil), Keys: keys, ClusterKey: key})
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, args, env string) {
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\n")
		}
		envm := map[string]string{}
		for _, line := range strings.Split(env, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				envm[k] = v
			}
		}
		getenv := func(k string) string { return envm[k] }

		// What the command line sets, read the way parseConfig reads it.
		fs, _ := newFlagSet(io.Discard)
		preErr := fs.Parse(argv)
		var fileFlags []string
		fs.VisitAll(func(fl *pflag.Flag) {
			if strings.HasSuffix(fl.Name, "-file") {
				fileFlags = append(fileFlags, fl.Value.String(), envm[envName(fl.Name)])
			}
		})
		for _, p := range fileFlags {
			if p != "" && (filepath.Base(p) != p || p == "." || p == "..") {
				return // only the prepared files
			}
		}

		c, err := parseConfig(argv, getenv, io.Discard)
		if err != nil {
			if c != nil && (errors.Is(err, pflag.ErrHelp) || preErr != nil) {
				t.Fatalf("a configuration and the error %v", err)
			}
			var secrets []string
			for _, name := range []string{"cookie-signing-key", "cookie-encryption-key", "oidc-issuer-client-secret", "peer-key", "cluster-secret-key"} {
				secrets = append(secrets, fs.Lookup(name).Value.String(), envm[envName(name)])
			}
			wantNoSecret(t, err, args+"\n"+env, secrets)
		} else if !c.ShowVersion {
			wantValidConfig(t, c, svc)
		}

		// The same flags through the environment.
		if preErr != nil {
			return
		}
		env2 := map[string]string{}
		for k, v := range envm {
			env2[k] = v
		}
		equivalent := true
		fs.Visit(func(fl *pflag.Flag) {
			if noEnv[fl.Name] || fl.Value.String() == "" {
				equivalent = false
			}
			env2[envName(fl.Name)] = fl.Value.String()
		})
		if !equivalent || fs.NArg() > 0 {
			return
		}
		c2, err2 := parseConfig(nil, func(k string) string { return env2[k] }, io.Discard)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("args %q: error %v; as environment %v: error %v", argv, err, env2, err2)
		}
		if err == nil {
			for _, cc := range []*config{c, c2} {
				if cc.ClusterKey.Generated {
					cc.ClusterKey.Keys = nil
				}
				for _, g := range cc.Browser.KeysGenerated {
					if g == "cookie-signing-key" {
						cc.Browser.SigningKeys = nil
					} else {
						cc.Browser.EncryptionKeys = nil
					}
				}
			}
			if !reflect.DeepEqual(c, c2) {
				t.Fatalf("args %q: %+v\nas environment: %+v", argv, c, c2)
			}
		}
	})
}

func wantNoSecret(t *testing.T, err error, input string, secrets []string) {
	t.Helper()
	// A value may hold several keys (a rotation): none may show.
	for _, s := range slices.Clone(secrets) {
		if f := strings.Fields(s); len(f) > 1 {
			secrets = append(secrets, f...)
		}
	}
	for _, s := range secrets {
		if len(s) >= 6 && strings.Count(input, s) == 1 && strings.Contains(err.Error(), s) {
			t.Fatalf("error %q shows the secret %q", err, s)
		}
	}
}

func wantValidConfig(t *testing.T, c *config, svc *lifecycle.Service) {
	t.Helper()
	if _, _, err := net.SplitHostPort(c.ListenAddress); err != nil {
		t.Fatalf("listen address %q", c.ListenAddress)
	}
	if u := c.ExternalURL; u != nil {
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			t.Fatalf("external URL %s", u)
		}
		if back, err := url.Parse(u.String()); err != nil || back.String() != u.String() {
			t.Fatalf("external URL %s does not parse again: %v", u, err)
		}
	}
	if c.OIDC.IssuerURL != "" && (c.OIDC.ClientID == "" || c.OIDC.ClientSecret == "") {
		t.Fatal("an issuer without client ID or secret")
	}
	for _, l := range []struct {
		name    string
		keys    [][]byte
		lengths []int
	}{
		{"signing", c.Browser.SigningKeys, []int{32, 64}},
		{"encryption", c.Browser.EncryptionKeys, []int{16, 24, 32}},
		{"cluster secret", c.ClusterKey.Keys, []int{32, 48, 64}},
	} {
		if len(l.keys) == 0 {
			t.Fatalf("no %s key", l.name)
		}
		for i, k := range l.keys {
			if !slices.Contains(l.lengths, len(k)) {
				t.Fatalf("%s key %d of %d bytes", l.name, i+1, len(k))
			}
		}
	}
	// Their owners accept them.
	if _, err := clusterkey.New(c.ClusterKey.Keys[0], c.ClusterKey.Keys[1:]...); err != nil {
		t.Fatalf("accepted cluster secret keys clusterkey refuses: %v", err)
	}
	if c.PrettyName == "" || strings.TrimSpace(c.PrettyName) != c.PrettyName {
		t.Fatalf("pretty name %q", c.PrettyName)
	}
	if err := binding.ValidatePrefix(c.Provider.NamespacePrefix); err != nil {
		t.Fatalf("accepted a prefix the provisioner refuses: %v", err)
	}
	if c.Provider.ConsumerScope != "Namespaced" && c.Provider.ConsumerScope != "Cluster" {
		t.Fatalf("scope %q", c.Provider.ConsumerScope)
	}
	if c.SessionTTL <= 0 || c.PollInterval <= 0 || c.PollInterval >= c.SessionTTL || c.GracePeriod <= 0 || c.MaxPolledSessions <= 0 || c.ShutdownTimeout <= 0 {
		t.Fatalf("durations and limits: %+v", c)
	}
	if errs := c.LongPoll.Validate(); len(errs) > 0 {
		t.Fatalf("accepted long poll options their owner refuses: %v", errs)
	}
	switch c.LogLevel {
	case slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError:
	default:
		t.Fatalf("log level %v", c.LogLevel)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		t.Fatalf("log format %q", c.LogFormat)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		t.Fatal("one TLS file without the other")
	}
	// The browser handler parses the allow-list and checks the cookie keys
	// again: it must agree.
	if _, err := browser.New(browser.Config{
		ExternalURL: &url.URL{Scheme: "https", Host: "bind.example.com"}, Sessions: svc,
		Login:          (*oidc.Authenticator)(nil),
		CookieHashKeys: c.Browser.SigningKeys, CookieBlockKeys: c.Browser.EncryptionKeys, CallbackAllowList: c.Browser.CallbackAllowList,
		NoCallbackFlow: c.Browser.NoCallbackFlow,
	}); err != nil {
		t.Fatalf("accepted an allow-list or cookie keys the browser handler refuses: %v", err)
	}
	s := c.Store
	switch s.Kind {
	case server.StoreMemory:
		return
	case server.StoreRing:
	default:
		t.Fatalf("store %q", s.Kind)
	}
	_, port, err := net.SplitHostPort(s.PeerListenAddress)
	if n, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || n == 0 {
		t.Fatalf("peer listen address %q: the peers cannot reach port %q", s.PeerListenAddress, port)
	}
	for _, p := range append([]string{s.PeerSelfURL}, s.Peers...) {
		u, err := url.Parse(p)
		if err != nil || u.Scheme != "https" || u.Port() == "" || (&url.URL{Scheme: u.Scheme, Host: u.Host}).String() != p {
			t.Fatalf("peer URL %q is not in the form the ring compares (%v)", p, err)
		}
		if back, err := url.Parse(u.String()); err != nil || back.String() != p {
			t.Fatalf("peer URL %q does not parse back: %v", p, err)
		}
	}
	if len(s.Peers) > 0 && !slices.Contains(s.Peers, s.PeerSelfURL) {
		t.Fatalf("peers %v without self %s", s.Peers, s.PeerSelfURL)
	}
	if len(s.PeerKeys) == 0 {
		t.Fatal("a ring without a peer key")
	}
	for _, k := range s.PeerKeys {
		if len(k) < sessionkey.MinKeyLen {
			t.Fatalf("peer key of %d bytes", len(k))
		}
	}
	dnsLabel := func(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }
	if !dnsLabel(s.Namespace) {
		t.Fatalf("session namespace %q", s.Namespace)
	}
	if (s.PeerServiceName == "") != (s.PeerServiceNamespace == "") || s.PeerServiceName != "" && (!dnsLabel(s.PeerServiceName) || !dnsLabel(s.PeerServiceNamespace)) {
		t.Fatalf("peer service %q/%q", s.PeerServiceNamespace, s.PeerServiceName)
	}
}
