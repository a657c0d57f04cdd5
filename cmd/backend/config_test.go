package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/server"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func mustParse(t *testing.T, args []string, e map[string]string) *config {
	t.Helper()
	c, err := parseConfig(args, env(e), io.Discard)
	if err != nil {
		t.Fatalf("parseConfig(%q): %v", args, err)
	}
	return c
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, nil, nil)
	if c.ListenAddress != ":8080" || c.ExternalURL != nil || c.PrettyName != "kube-bind provider" ||
		c.Provider.NamespacePrefix != "kube-bind-" || c.Provider.ConsumerScope != "Namespaced" ||
		c.SessionTTL != 10*time.Minute || c.PollInterval != 2*time.Second || c.GracePeriod != time.Minute ||
		c.MaxPolledSessions != 100000 || c.LogLevel != slog.LevelInfo || c.LogFormat != "json" ||
		c.LongPoll.MaxWait != 30*time.Second || c.LongPoll.MaxHeld != 1000 || c.Store.Kind != server.StoreMemory {
		t.Errorf("defaults: %+v", c)
	}
	b := c.Browser
	if len(b.SigningKeys) != 1 || len(b.SigningKeys[0]) != 32 || len(b.EncryptionKeys) != 1 || len(b.EncryptionKeys[0]) != 32 ||
		len(b.KeysGenerated) != 2 || len(c.ClusterKey.Keys) != 1 || !c.ClusterKey.Generated {
		t.Errorf("keys not generated: %d %d %v, cluster %d %v", len(b.SigningKeys), len(b.EncryptionKeys), b.KeysGenerated, len(c.ClusterKey.Keys), c.ClusterKey.Generated)
	}
	if c2 := mustParse(t, nil, nil); bytes.Equal(c.Browser.SigningKeys[0], c2.Browser.SigningKeys[0]) {
		t.Error("generated keys are not random")
	}
}

func TestEnvName(t *testing.T) {
	if got := envName("oidc-issuer-url"); got != "KUBE_BIND_OIDC_ISSUER_URL" {
		t.Errorf("envName = %q", got)
	}
}

func TestFlagBeatsEnvBeatsDefault(t *testing.T) {
	e := map[string]string{
		"KUBE_BIND_POLL_INTERVAL": "3s",
		"KUBE_BIND_SESSION_TTL":   "5m",
		"KUBE_BIND_PRETTY_NAME":   "From Env",
		"KUBE_BIND_EXTERNAL_URL":  "https://env.example.com",
	}
	c := mustParse(t, []string{"--poll-interval=4s", "--pretty-name", "From Flag"}, e)
	if c.PollInterval != 4*time.Second || c.PrettyName != "From Flag" {
		t.Errorf("flags did not win: %s %q", c.PollInterval, c.PrettyName)
	}
	if c.SessionTTL != 5*time.Minute || c.ExternalURL.String() != "https://env.example.com" {
		t.Errorf("env not used: %s %v", c.SessionTTL, c.ExternalURL)
	}
	if c.GracePeriod != time.Minute {
		t.Errorf("default lost: %s", c.GracePeriod)
	}
	if c := mustParse(t, []string{"--long-poll-max-wait=0"}, map[string]string{"KUBE_BIND_MAX_LONG_POLLS": "7"}); c.LongPoll.MaxWait != 0 || c.LongPoll.MaxHeld != 7 {
		t.Errorf("long poll flags: %+v", c.LongPoll)
	}
	if got := mustParse(t, []string{"--callback-flow=true"}, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "false"}); got.Browser.NoCallbackFlow {
		t.Error("--callback-flow=true on the command line did not win over KUBE_BIND_CALLBACK_FLOW=false")
	}
}

// Every component's flags can come from the environment, and so can the
// pod's own name, namespace and IP the chart sets.
func TestEnvironment(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 48)
	enc := bytes.Repeat([]byte{7}, 16)
	c := mustParse(t, nil, map[string]string{
		"KUBE_BIND_SESSION_STORE":           "ring",
		"KUBE_BIND_PEER_LISTEN_ADDRESS":     ":8091",
		"KUBE_BIND_PEER_SERVICE":            "kube-bind/backend-peers",
		"KUBE_BIND_PEER_PORT_NAME":          "peer",
		"KUBE_BIND_PEER_KEY":                base64.RawURLEncoding.EncodeToString(key[:32]),
		"KUBE_BIND_CLUSTER_SECRET_KEY":      base64.StdEncoding.EncodeToString(key),
		"KUBE_BIND_COOKIE_ENCRYPTION_KEY":   base64.RawURLEncoding.EncodeToString(enc),
		"KUBE_BIND_CALLBACK_FLOW":           "false",
		"KUBE_BIND_GC_UNUSED_BINDING_AFTER": "2h",
		"KUBE_BIND_GC_DRY_RUN":              "true",
		"KUBE_BIND_CLI_TOKENS_NOT_BEFORE":   "2026-11-26T10:00:00Z",
		"POD_IP":                            "10.1.2.3",
		"POD_NAMESPACE":                     "kube-bind",
		"POD_NAME":                          "kbb-0",
	})
	s := c.Store
	if s.Kind != server.StoreRing || s.PeerSelfURL != "https://10.1.2.3:8091" || s.PeerServiceNamespace != "kube-bind" || s.PeerServiceName != "backend-peers" ||
		s.PeerPortName != "peer" || len(s.Peers) != 0 || len(s.PeerKeys) != 1 || !bytes.Equal(s.PeerKeys[0], key[:32]) || s.Namespace != "kube-bind" {
		t.Errorf("discovery ring: %+v", s)
	}
	if !reflect.DeepEqual(c.ClusterKey.Keys, [][]byte{key}) || c.ClusterKey.Generated || !reflect.DeepEqual(c.Browser.EncryptionKeys, [][]byte{enc}) ||
		!slices.Equal(c.Browser.KeysGenerated, []string{"cookie-signing-key"}) {
		t.Errorf("keys: cluster %x (generated %v), encryption %x, generated %v", c.ClusterKey.Keys, c.ClusterKey.Generated, c.Browser.EncryptionKeys, c.Browser.KeysGenerated)
	}
	if !c.Browser.NoCallbackFlow || len(c.Browser.CallbackAllowList) != 0 {
		t.Errorf("KUBE_BIND_CALLBACK_FLOW=false: NoCallbackFlow %v, allow-list %v", c.Browser.NoCallbackFlow, c.Browser.CallbackAllowList)
	}
	if gc := c.Controllers.GC; gc.UnusedBindingAfter != 2*time.Hour || !gc.DryRun {
		t.Errorf("gc: %+v", gc)
	}
	if l := c.Controllers.Leader; !l.Enabled || l.Namespace != "kube-bind" || l.PodName != "kbb-0" {
		t.Errorf("leader election from POD_NAMESPACE and POD_NAME: %+v", l)
	}
	if !c.CLITokens.NotBefore.Equal(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("CLI tokens not before %s", c.CLITokens.NotBefore)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"KUBE_BIND_EXTERNAL_URL": "::"}, "--external-url"},
		{nil, map[string]string{"KUBE_BIND_POLL_INTERVAL": "soon"}, `invalid value "soon" for KUBE_BIND_POLL_INTERVAL (--poll-interval): want a duration`},
		{nil, map[string]string{"KUBE_BIND_MAX_POLLED_SESSIONS": "many"}, "want a whole number"},
		{nil, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "maybe"}, "KUBE_BIND_CALLBACK_FLOW"},
		{nil, map[string]string{"KUBE_BIND_COOKIE_SIGNING_KEY": "short"}, "--cookie-signing-key"},
		{nil, map[string]string{"KUBE_BIND_MAX_LONG_POLLS": "0"}, "--max-long-polls 0: must be positive"},
		{[]string{"--callback-allowed-urls=https://cli.example.com/cb"}, map[string]string{"KUBE_BIND_CALLBACK_FLOW": "false"}, "--callback-allowed-urls with --callback-flow=false"},
		{[]string{"--gc-unused-binding-after=90m", "--session-ttl=2h"}, nil, "--gc-unused-binding-after 1h30m0s: must be longer than the session TTL 2h0m0s"},
		{[]string{"--listen-address", "8080"}, nil, "--listen-address"},
		{[]string{"--oidc-issuer-url", "https://idp"}, nil, "--oidc-issuer-client-id is required"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--memory-limit", "1Mi"}, nil, "--memory-limit"},
		{[]string{"stray"}, nil, "unexpected arguments"},
	} {
		_, err := parseConfig(c.args, env(c.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseConfig(%q, %v) = %v, want an error containing %q", c.args, c.env, err, c.want)
		}
	}
	// Secrets from the environment are not echoed.
	_, err := parseConfig(nil, env(map[string]string{"KUBE_BIND_SESSION_TTL": "x", "KUBE_BIND_COOKIE_SIGNING_KEY": "topsecretvalue"}), io.Discard)
	if err == nil || strings.Contains(err.Error(), "topsecretvalue") {
		t.Errorf("error %v", err)
	}
	secret := "c2VjcmV0LXRoYXQtaXMtZmFyLXRvby1zaG9ydA"
	_, err = parseConfig([]string{"--session-store=ring", "--peer-listen-address=127.0.0.1:8091"}, env(map[string]string{"KUBE_BIND_PEER_KEY": secret}), io.Discard)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("error %v", err)
	}
	// Several mistakes, of several components, are reported together.
	_, err = parseConfig([]string{"--log-format=xml", "--consumer-scope=x", "--session-store=redis"}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--log-format") || !strings.Contains(err.Error(), "--consumer-scope") || !strings.Contains(err.Error(), "--session-store") {
		t.Errorf("joined errors: %v", err)
	}
	for _, help := range []string{"--help", "-h"} {
		var usage bytes.Buffer
		if _, err := parseConfig([]string{help}, env(nil), &usage); !errors.Is(err, pflag.ErrHelp) || !strings.Contains(usage.String(), "--cluster-secret-key-file") {
			t.Errorf("%s: %v\n%s", help, err, usage.String())
		}
	}
}
