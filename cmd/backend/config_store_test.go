package main

import (
	"bytes"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/server"
)

func TestStoreDefaultsToMemory(t *testing.T) {
	c := mustParse(t, nil, nil)
	if c.Store.Kind != server.StoreMemory || c.Store.PeerKeys != nil || len(c.CallbackAllowList) != 0 {
		t.Errorf("store defaults: %+v, allow list %v", c.Store, c.CallbackAllowList)
	}
}

func TestHashringConfig(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 48)
	keyFile := filepath.Join(t.TempDir(), "peer-key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Static peers, self URL derived from the listen address.
	c := mustParse(t, []string{
		"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--session-namespace=kube-bind",
		"--peers", "https://127.0.0.1:8091/, https://127.0.0.1:8092",
		"--peer-key-file", keyFile,
	}, nil)
	s := c.Store
	if s.Kind != server.StoreHashring || s.PeerListenAddress != "127.0.0.1:8091" || s.PeerSelfURL != "https://127.0.0.1:8091" ||
		!slices.Equal(s.Peers, []string{"https://127.0.0.1:8091", "https://127.0.0.1:8092"}) || len(s.PeerKeys) != 1 ||
		!bytes.Equal(s.PeerKeys[0], key) || s.Namespace != "kube-bind" {
		t.Errorf("static hashring: %+v", s)
	}

	// Discovery, everything from the environment, self URL from POD_IP.
	c = mustParse(t, nil, map[string]string{
		"KUBE_BIND_SESSION_STORE":       "hashring",
		"KUBE_BIND_PEER_LISTEN_ADDRESS": ":8091",
		"KUBE_BIND_PEER_SERVICE":        "kube-bind/backend-peers",
		"KUBE_BIND_PEER_PORT_NAME":      "peer",
		"KUBE_BIND_PEER_KEY":            base64.RawURLEncoding.EncodeToString(key[:32]),
		"POD_IP":                        "10.1.2.3",
		"POD_NAMESPACE":                 "kube-bind",
	})
	s = c.Store
	if s.PeerSelfURL != "https://10.1.2.3:8091" || s.PeerServiceNamespace != "kube-bind" || s.PeerServiceName != "backend-peers" ||
		s.PeerPortName != "peer" || len(s.Peers) != 0 || len(s.PeerKeys) != 1 || !bytes.Equal(s.PeerKeys[0], key[:32]) || s.Namespace != "kube-bind" {
		t.Errorf("discovery hashring: %+v", s)
	}

	// An explicit self URL wins over POD_IP; IPv6 pod IPs are bracketed.
	c = mustParse(t, []string{"--session-store=hashring", "--peer-listen-address=:8091", "--peer-self-url=https://replica-0.peers:8091",
		"--peer-key-file", keyFile}, map[string]string{"POD_IP": "10.1.2.3", "POD_NAMESPACE": "ns"})
	if c.Store.PeerSelfURL != "https://replica-0.peers:8091" {
		t.Errorf("explicit self: %+v", c.Store)
	}
	c = mustParse(t, []string{"--session-store=hashring", "--peer-listen-address=:8091", "--peer-key-file", keyFile},
		map[string]string{"POD_IP": "fd00::5", "POD_NAMESPACE": "ns"})
	if c.Store.PeerSelfURL != "https://[fd00::5]:8091" {
		t.Errorf("IPv6 self: %s", c.Store.PeerSelfURL)
	}

	// A rotation: two keys in the file, the current one first.
	next := bytes.Repeat([]byte{7}, 32)
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(next)+"\n"+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = mustParse(t, []string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--peer-key-file", keyFile},
		map[string]string{"POD_NAMESPACE": "ns"})
	if len(c.Store.PeerKeys) != 2 || !bytes.Equal(c.Store.PeerKeys[0], next) || !bytes.Equal(c.Store.PeerKeys[1], key) {
		t.Errorf("two peer keys: %d", len(c.Store.PeerKeys))
	}

	c = mustParse(t, []string{"--callback-allowed-urls", "https://cli.example.com/cb, http://10.0.0.1:9000"}, nil)
	if !slices.Equal(c.CallbackAllowList, []string{"https://cli.example.com/cb", "http://10.0.0.1:9000"}) {
		t.Errorf("callback allow list %v", c.CallbackAllowList)
	}
	if c.NoCallbackFlow {
		t.Error("the callback flow is off by default")
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--callback-flow=false"}, nil},
		{nil, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "false"}},
	} {
		if got := mustParse(t, c.args, c.env); !got.NoCallbackFlow || len(got.CallbackAllowList) != 0 {
			t.Errorf("%q %v: NoCallbackFlow %v, allow-list %v; want the callback flow off", c.args, c.env, got.NoCallbackFlow, got.CallbackAllowList)
		}
	}
	if got := mustParse(t, []string{"--callback-flow=true"}, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "false"}); got.NoCallbackFlow {
		t.Error("--callback-flow=true on the command line did not win over KUBE_BIND_CALLBACK_FLOW=false")
	}
}

func TestInvalidStoreConfig(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	ok := []string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + key, "--session-namespace=ns"}
	with := func(extra ...string) []string { return append(slices.Clone(ok), extra...) }
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--session-store=redis"}, nil, `--session-store "redis": want memory or hashring`},
		{[]string{"--peers=https://a:1"}, nil, "--peers: only used with --session-store=hashring"},
		{[]string{"--peer-key-file=/x"}, nil, "--peer-key-file: only used with --session-store=hashring"},
		{[]string{"--session-store=hashring", "--peer-key=" + key}, nil, "--peer-listen-address is required"},
		{[]string{"--session-store=hashring", "--peer-listen-address=8091", "--peer-key=" + key}, nil, `--peer-listen-address "8091": want host:port`},
		{[]string{"--session-store=hashring", "--peer-listen-address=:0", "--peer-key=" + key}, nil, "want a fixed port"},
		{[]string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:+8091", "--peer-key=" + key}, nil, "want a fixed port"}, // found by FuzzParseConfig
		{[]string{"--session-store=hashring", "--peer-listen-address=:8091", "--peer-key=" + key}, nil, "--peer-self-url is required"},
		{[]string{"--session-store=hashring", "--peer-listen-address=:8091", "--peer-key=" + key}, map[string]string{"POD_IP": "pod"}, `POD_IP "pod" is not an IP address`},
		{with("--peer-self-url=10.0.0.1:8091"), nil, "--peer-self-url"},
		{with("--peer-self-url=https://10.0.0.1"), nil, "want an explicit port"},
		{with("--peer-self-url=https://10.0.0.1:8091/sessions"), nil, "no path or query"},
		{with("--peer-self-url=http://10.0.0.1:8091"), nil, "want https"},
		{[]string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + key}, nil, "--session-namespace is required"},
		{with("--session-namespace=Not_A_Namespace"), nil, "--session-namespace"},
		{[]string{"--session-namespace=ns"}, nil, "--session-namespace: only used with --session-store=hashring"},
		// Found by FuzzParseConfig: percent-escapes in the host decode into
		// a peer URL that does not parse back.
		{[]string{"--session-store=hashring", "--peer-key=" + key, "--peer-listen-address=10.0.0.5.\r\r//10.0.0.508091dh@@:8091"}, nil,
			"--peer-listen-address \"10.0.0.5.\\r\\r//10.0.0.508091dh@@:8091\": want an IP address or a DNS name"},
		{with("--peer-self-url=https://10.0.0.5.%0D%0D%2F%2F10.0.0.5%40:8091"), nil, "--peer-self-url"},
		{with("--peers=https://127.0.0.1:8091,https://a%2Fb:8092"), nil, "--peers"},
		{with("--peer-self-url=https://10.0.0.1:+8091"), nil, "--peer-self-url"},
		{with("--peers=https://127.0.0.1:8092,https://127.0.0.1:8093"), nil, "--peers must list this replica's own peer URL https://127.0.0.1:8091"},
		{with("--peers=https://127.0.0.1:8091,ftp://x:1"), nil, `--peers: "ftp://x:1"`},
		{with("--peers=https://127.0.0.1:8091", "--peer-service=ns/svc"), nil, "give only one"},
		{with("--peer-service=svc"), nil, `--peer-service "svc": want namespace/name`},
		{with("--peer-service=ns/Svc_1"), nil, "--peer-service"},
		{with("--peer-port-name=peer"), nil, "--peer-port-name: only used with --peer-service"},
		{[]string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091"}, nil, "--peer-key-file (or --peer-key) is required"},
		{[]string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + base64.StdEncoding.EncodeToString(make([]byte, 31))}, nil, "key 1 decodes to 31 bytes, want at least 32"},
		{[]string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=not-base64!"}, nil, "--peer-key: key 1 is not base64"},
		{[]string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091", "--peer-key=" + key, "--peer-key-file=/x"}, nil, "give only one"},
		{[]string{"--callback-allowed-urls=cli.example.com"}, nil, `--callback-allowed-urls: "cli.example.com"`},
		{[]string{"--callback-allowed-urls=https://x/cb?y=1"}, nil, "--callback-allowed-urls"},
		{[]string{"--callback-allowed-urls=https://x/a/../cb"}, nil, "matched exactly"},
		{[]string{"--callback-flow=false", "--callback-allowed-urls=https://cli.example.com/cb"}, nil, "--callback-allowed-urls with --callback-flow=false"},
		{[]string{"--callback-allowed-urls=https://cli.example.com/cb"}, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "false"}, "--callback-allowed-urls with --callback-flow=false"},
		{nil, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "maybe"}, "KUBE_BIND_CALLBACK_FLOW"},
	} {
		_, err := parseConfig(c.args, env(c.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseConfig(%q, %v) = %v, want an error containing %q", c.args, c.env, err, c.want)
		}
	}

	// The peer key is never echoed, from the command line or the environment.
	secret := "c2VjcmV0LXRoYXQtaXMtZmFyLXRvby1zaG9ydA"
	for _, e := range []map[string]string{nil, {"KUBE_BIND_PEER_KEY": secret}} {
		args := []string{"--session-store=hashring", "--peer-listen-address=127.0.0.1:8091"}
		if e == nil {
			args = append(args, "--peer-key="+secret)
		}
		_, err := parseConfig(args, env(e), io.Discard)
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("error %v", err)
		}
	}
}
