package server

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// completeStore parses args into the store flags and completes them with
// the pod's IP and namespace from the environment.
func completeStore(t *testing.T, args []string, podIP, podNamespace string) (StoreConfig, error) {
	t.Helper()
	var r storeFlags
	if err := flagvalue.Parse(args, func(fs *pflag.FlagSet) { r.addFlags(fs) }); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	c, errs := r.complete(podIP, podNamespace)
	return c, errors.Join(errs...)
}

func mustCompleteStore(t *testing.T, args []string, podIP, podNamespace string) StoreConfig {
	t.Helper()
	c, err := completeStore(t, args, podIP, podNamespace)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return c
}

func TestRingConfig(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 48)
	keyFile := filepath.Join(t.TempDir(), "peer-key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Static peers, self URL derived from the listen address.
	s := mustCompleteStore(t, []string{
		"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--session-namespace=kube-bind",
		"--peers", "https://127.0.0.1:8091/, https://127.0.0.1:8092",
		"--peer-key-file", keyFile,
	}, "", "")
	if s.Kind != StoreRing || s.PeerListenAddress != "127.0.0.1:8091" || s.PeerSelfURL != "https://127.0.0.1:8091" ||
		!slices.Equal(s.Peers, []string{"https://127.0.0.1:8091", "https://127.0.0.1:8092"}) || len(s.PeerKeys) != 1 ||
		!bytes.Equal(s.PeerKeys[0], key) || s.Namespace != "kube-bind" {
		t.Errorf("static ring: %+v", s)
	}

	if s.Deprecated != "" {
		t.Errorf("--session-store=ring called deprecated: %q", s.Deprecated)
	}
	// The store's former name still starts it (values of an older
	// release), with a warning to give.
	old := mustCompleteStore(t, []string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--session-namespace=kube-bind",
		"--peer-key-file", keyFile}, "", "")
	if old.Kind != StoreRing || !strings.Contains(old.Deprecated, "--session-store=ring") {
		t.Errorf("--session-store=hashring: kind %q, deprecation %q", old.Kind, old.Deprecated)
	}

	// Discovery, self URL from POD_IP, namespace from POD_NAMESPACE.
	s = mustCompleteStore(t, []string{"--session-store=ring", "--peer-listen-address=:8091", "--peer-service=kube-bind/backend-peers",
		"--peer-port-name=peer", "--peer-key=" + base64.RawURLEncoding.EncodeToString(key[:32])}, "10.1.2.3", "kube-bind")
	if s.PeerSelfURL != "https://10.1.2.3:8091" || s.PeerServiceNamespace != "kube-bind" || s.PeerServiceName != "backend-peers" ||
		s.PeerPortName != "peer" || len(s.Peers) != 0 || len(s.PeerKeys) != 1 || !bytes.Equal(s.PeerKeys[0], key[:32]) || s.Namespace != "kube-bind" {
		t.Errorf("discovery ring: %+v", s)
	}

	// An explicit self URL wins over POD_IP; IPv6 pod IPs are bracketed.
	s = mustCompleteStore(t, []string{"--session-store=ring", "--peer-listen-address=:8091", "--peer-self-url=https://replica-0.peers:8091",
		"--peer-key-file", keyFile}, "10.1.2.3", "ns")
	if s.PeerSelfURL != "https://replica-0.peers:8091" {
		t.Errorf("explicit self: %+v", s)
	}
	s = mustCompleteStore(t, []string{"--session-store=ring", "--peer-listen-address=:8091", "--peer-key-file", keyFile}, "fd00::5", "ns")
	if s.PeerSelfURL != "https://[fd00::5]:8091" {
		t.Errorf("IPv6 self: %s", s.PeerSelfURL)
	}

	// A rotation: two keys in the file, the current one first.
	next := bytes.Repeat([]byte{7}, 32)
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(next)+"\n"+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = mustCompleteStore(t, []string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key-file", keyFile}, "", "ns")
	if len(s.PeerKeys) != 2 || !bytes.Equal(s.PeerKeys[0], next) || !bytes.Equal(s.PeerKeys[1], key) {
		t.Errorf("two peer keys: %d", len(s.PeerKeys))
	}
}

func TestInvalidStoreConfig(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	ok := []string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + key, "--session-namespace=ns"}
	with := func(extra ...string) []string { return append(slices.Clone(ok), extra...) }
	for _, c := range []struct {
		args  []string
		podIP string
		want  string
	}{
		{[]string{"--session-store=redis"}, "", `--session-store "redis": want memory or ring`},
		{[]string{"--peers=https://a:1"}, "", "--peers: only used with --session-store=ring"},
		{[]string{"--peer-key-file=/x"}, "", "--peer-key-file: only used with --session-store=ring"},
		{[]string{"--session-store=ring", "--peer-key=" + key}, "", "--peer-listen-address is required"},
		{[]string{"--session-store=ring", "--peer-listen-address=8091", "--peer-key=" + key}, "", `--peer-listen-address "8091": want host:port`},
		{[]string{"--session-store=ring", "--peer-listen-address=:0", "--peer-key=" + key}, "", "want a fixed port"},
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:+8091", "--peer-key=" + key}, "", "want a fixed port"}, // found by FuzzParseConfig
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:080910", "--peer-key=" + key}, "", "want a fixed port"},
		{[]string{"--session-store=ring", "--peer-listen-address=:8091", "--peer-key=" + key}, "", "--peer-self-url is required"},
		{[]string{"--session-store=ring", "--peer-listen-address=:8091", "--peer-key=" + key}, "pod", `POD_IP "pod" is not an IP address`},
		{with("--peer-self-url=10.0.0.1:8091"), "", "--peer-self-url"},
		{with("--peer-self-url=https://10.0.0.1"), "", "want an explicit port"},
		{with("--peer-self-url=https://10.0.0.1:8091/sessions"), "", "no path or query"},
		{with("--peer-self-url=http://10.0.0.1:8091"), "", "want https"},
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + key}, "", "--session-namespace is required"},
		{with("--session-namespace=Not_A_Namespace"), "", "--session-namespace"},
		{[]string{"--session-namespace=ns"}, "", "--session-namespace: only used with --session-store=ring"},
		// Found by FuzzParseConfig: percent-escapes in the host decode into
		// a peer URL that does not parse back.
		{[]string{"--session-store=ring", "--peer-key=" + key, "--peer-listen-address=10.0.0.5.\r\r//10.0.0.508091dh@@:8091"}, "",
			"--peer-listen-address \"10.0.0.5.\\r\\r//10.0.0.508091dh@@:8091\": want an IP address or a DNS name"},
		{with("--peer-self-url=https://10.0.0.5.%0D%0D%2F%2F10.0.0.5%40:8091"), "", "--peer-self-url"},
		{with("--peers=https://127.0.0.1:8091,https://a%2Fb:8092"), "", "--peers"},
		{with("--peer-self-url=https://10.0.0.1:+8091"), "", "--peer-self-url"},
		{with("--peers=https://127.0.0.1:8092,https://127.0.0.1:8093"), "", "--peers must list this replica's own peer URL https://127.0.0.1:8091"},
		{with("--peers=https://127.0.0.1:8091,ftp://x:1"), "", `--peers: "ftp://x:1"`},
		{with("--peers=https://127.0.0.1:8091", "--peer-service=ns/svc"), "", "give only one"},
		{with("--peer-service=svc"), "", `--peer-service "svc": want namespace/name`},
		{with("--peer-service=ns/Svc_1"), "", "--peer-service"},
		{with("--peer-port-name=peer"), "", "--peer-port-name: only used with --peer-service"},
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091"}, "", "--peer-key-file (or --peer-key) is required"},
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + base64.StdEncoding.EncodeToString(make([]byte, 31))}, "", "key 1 decodes to 31 bytes, want at least 32"},
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=not-base64!"}, "", "--peer-key: key 1 is not base64"},
		{[]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + key, "--peer-key-file=/x"}, "", "give only one"},
	} {
		_, err := completeStore(t, c.args, c.podIP, "")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q (POD_IP %q) = %v, want an error containing %q", c.args, c.podIP, err, c.want)
		}
	}

	// The peer key is never echoed.
	secret := "c2VjcmV0LXRoYXQtaXMtZmFyLXRvby1zaG9ydA"
	_, err := completeStore(t, []string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + secret}, "", "")
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("error %v", err)
	}
}
