package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/credentials"
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
		c.NamespacePrefix != "kube-bind-" || c.ConsumerScope != "Namespaced" ||
		c.SessionTTL != 10*time.Minute || c.PollInterval != 2*time.Second || c.GracePeriod != time.Minute ||
		c.MaxPolledSessions != 100000 || c.LogLevel != slog.LevelInfo || c.LogFormat != "json" ||
		c.LongPoll.MaxWait != 30*time.Second || c.LongPoll.MaxHeld != 1000 {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.CookieSigningKeys) != 1 || len(c.CookieSigningKeys[0]) != 32 || len(c.CookieEncryptionKeys) != 1 || len(c.CookieEncryptionKeys[0]) != 32 ||
		len(c.CookieKeysGenerated) != 2 {
		t.Errorf("cookie keys not generated: %d %d %v", len(c.CookieSigningKeys), len(c.CookieEncryptionKeys), c.CookieKeysGenerated)
	}
	if c2 := mustParse(t, nil, nil); bytes.Equal(c.CookieSigningKeys[0], c2.CookieSigningKeys[0]) {
		t.Error("generated keys are not random")
	}
}

// The cluster secret key: random (and flagged) when unset, else the
// configured one; the credential flags' defaults and values.
func TestClusterKeyAndCredentials(t *testing.T) {
	c := mustParse(t, nil, nil)
	if len(c.ClusterSecretKeys) != 1 || len(c.ClusterSecretKeys[0]) != 32 || !c.ClusterSecretKeyGenerated {
		t.Errorf("cluster secret key not generated: %d keys, generated %v", len(c.ClusterSecretKeys), c.ClusterSecretKeyGenerated)
	}
	if c.Credentials != (credentials.Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute, BindingLifetime: 720 * time.Hour}) {
		t.Errorf("credential defaults %+v", c.Credentials)
	}
	key := bytes.Repeat([]byte{9}, 48)
	c = mustParse(t, []string{"--credential-lifetime=10m", "--credential-rotation-point=0.05", "--credential-overlap=20s", "--binding-lifetime=0"},
		map[string]string{"KUBE_BIND_CLUSTER_SECRET_KEY": base64.StdEncoding.EncodeToString(key)})
	if !reflect.DeepEqual(c.ClusterSecretKeys, [][]byte{key}) || c.ClusterSecretKeyGenerated {
		t.Errorf("cluster secret keys %x (generated %v)", c.ClusterSecretKeys, c.ClusterSecretKeyGenerated)
	}
	if c.Credentials != (credentials.Policy{Lifetime: 10 * time.Minute, RotationPoint: 0.05, Overlap: 20 * time.Second, BindingLifetime: 0}) {
		t.Errorf("credentials %+v", c.Credentials)
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
}

func TestSecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sign := make([]byte, 64)
	for i := range sign {
		sign[i] = byte(i)
	}
	enc := bytes.Repeat([]byte{7}, 16)
	c := mustParse(t, []string{
		"--oidc-issuer-url=https://idp.example.com", "--oidc-issuer-client-id=backend",
		"--oidc-issuer-client-secret-file=" + write("secret", "s3cret\n"),
		"--cookie-signing-key-file=" + write("sign", base64.StdEncoding.EncodeToString(sign)+"\n"),
	}, map[string]string{"KUBE_BIND_COOKIE_ENCRYPTION_KEY": base64.RawURLEncoding.EncodeToString(enc)})
	if c.OIDCClientSecret != "s3cret" || !reflect.DeepEqual(c.CookieSigningKeys, [][]byte{sign}) || !reflect.DeepEqual(c.CookieEncryptionKeys, [][]byte{enc}) ||
		len(c.CookieKeysGenerated) != 0 {
		t.Errorf("secrets: %q %x %x %v", c.OIDCClientSecret, c.CookieSigningKeys, c.CookieEncryptionKeys, c.CookieKeysGenerated)
	}
}

// Key rotation: each of the three keys takes several base64 keys, one per
// line in its file (or separated by white space in its value), the first
// current; each key is checked on its own, and an error names the flag
// and the key's position, never the key.
func TestKeyLists(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b64 := base64.StdEncoding.EncodeToString
	newSign, oldSign := bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 32)
	newEnc, oldEnc, olderEnc := bytes.Repeat([]byte{3}, 16), bytes.Repeat([]byte{4}, 32), bytes.Repeat([]byte{5}, 24)
	newCluster, oldCluster := bytes.Repeat([]byte{6}, 48), bytes.Repeat([]byte{7}, 32)
	c := mustParse(t, []string{
		"--cookie-signing-key-file=" + write("sign", b64(newSign), b64(oldSign)),
		"--cluster-secret-key-file=" + write("cluster", "", "  "+b64(newCluster)+"\r", base64.RawURLEncoding.EncodeToString(oldCluster)),
	}, map[string]string{"KUBE_BIND_COOKIE_ENCRYPTION_KEY": b64(newEnc) + " " + b64(oldEnc) + "\n" + b64(olderEnc)})
	if !reflect.DeepEqual(c.CookieSigningKeys, [][]byte{newSign, oldSign}) ||
		!reflect.DeepEqual(c.CookieEncryptionKeys, [][]byte{newEnc, oldEnc, olderEnc}) ||
		!reflect.DeepEqual(c.ClusterSecretKeys, [][]byte{newCluster, oldCluster}) ||
		len(c.CookieKeysGenerated) != 0 || c.ClusterSecretKeyGenerated {
		t.Errorf("keys: %x %x %x, generated %v %v", c.CookieSigningKeys, c.CookieEncryptionKeys, c.ClusterSecretKeys, c.CookieKeysGenerated, c.ClusterSecretKeyGenerated)
	}

	short := b64(bytes.Repeat([]byte{9}, 20))
	for _, c := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--cookie-signing-key-file=" + write("short2", b64(newSign), short)}, nil,
			[]string{"--cookie-signing-key: key 2 decodes to 20 bytes, want 32 or 64"}},
		{[]string{"--cluster-secret-key", b64(newCluster) + " " + short}, nil,
			[]string{"--cluster-secret-key: key 2 decodes to 20 bytes, want 32 or 48 or 64"}},
		{nil, map[string]string{"KUBE_BIND_COOKIE_ENCRYPTION_KEY": "!!!notbase64 " + b64(newEnc) + " " + short}, []string{
			"--cookie-encryption-key: key 1 is not base64", "--cookie-encryption-key: key 3 decodes to 20 bytes, want 16 or 24 or 32"}},
		// openssl rand -base64 64 breaks its output after 64 characters.
		{[]string{"--cookie-signing-key-file=" + write("wrapped", b64(newSign)[:64], b64(newSign)[64:])}, nil, []string{
			"--cookie-signing-key: key 1 decodes to 48 bytes", "is a key broken over several lines? Make one with: openssl rand -base64 64 | tr -d '\\n'"}},
	} {
		_, err := parseConfig(c.args, env(c.env), io.Discard)
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("parseConfig(%q, %v) = %v, want an error containing %q", c.args, c.env, err, want)
			}
		}
		if err != nil && (strings.Contains(err.Error(), short) || strings.Contains(err.Error(), b64(newSign)[:20])) {
			t.Errorf("error %q shows a key", err)
		}
	}
}

func TestInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--external-url", "bind.example.com"}, nil, `--external-url "bind.example.com": must be an absolute http:// or https:// URL`},
		{[]string{"--external-url", "ftp://x"}, nil, "--external-url"},
		{[]string{"--external-url", "https://x/?q=1"}, nil, "must not have a query"},
		{nil, map[string]string{"KUBE_BIND_EXTERNAL_URL": "::"}, "--external-url"},
		{nil, map[string]string{"KUBE_BIND_POLL_INTERVAL": "soon"}, `invalid value "soon" for KUBE_BIND_POLL_INTERVAL (--poll-interval): want a duration`},
		{nil, map[string]string{"KUBE_BIND_MAX_POLLED_SESSIONS": "many"}, "want a whole number"},
		{nil, map[string]string{"KUBE_BIND_COOKIE_SIGNING_KEY": "short"}, "--cookie-signing-key"},
		{[]string{"--listen-address", "8080"}, nil, "--listen-address"},
		{[]string{"--diagnostics-address", "9090"}, nil, `--diagnostics-address "9090": want host:port`},
		{[]string{"--listen-address", ":9000", "--diagnostics-address", "127.0.0.1:9000"}, nil, "needs a port of its own"},
		{[]string{"--oidc-issuer-url", "https://idp"}, nil, "--oidc-issuer-client-id is required"},
		{[]string{"--oidc-issuer-url", "https://idp", "--oidc-issuer-client-id", "x"}, nil, "--oidc-issuer-client-secret or"},
		{[]string{"--oidc-issuer-client-secret", "a", "--oidc-issuer-client-secret-file", "/x"}, nil, "give only one"},
		{[]string{"--oidc-issuer-client-secret-file", filepath.Join(dir, "missing")}, nil, "--oidc-issuer-client-secret-file"},
		{[]string{"--cookie-signing-key", base64.StdEncoding.EncodeToString(make([]byte, 20))}, nil, "decodes to 20 bytes, want 32 or 64"},
		{[]string{"--cookie-encryption-key", "!!!notbase64"}, nil, "--cookie-encryption-key: not base64"},
		{[]string{"--external-ca-file", notPEM}, nil, "no PEM certificate"},
		{[]string{"--external-address", "api.example.com:6443"}, nil, "--external-address"},
		{[]string{"--consumer-scope", "Everything"}, nil, "want Namespaced or Cluster"},
		{[]string{"--namespace-prefix", "Kube_"}, nil, "--namespace-prefix"},
		{[]string{"--poll-interval", "0s"}, nil, "--poll-interval 0s: must be positive"},
		{[]string{"--poll-interval", "20m"}, nil, "must be shorter than --session-ttl"},
		{[]string{"--grace-period", "-1s"}, nil, "--grace-period"},
		{[]string{"--max-polled-sessions", "0"}, nil, "--max-polled-sessions"},
		{[]string{"--max-polled-sessions", "10000001"}, nil, "at most 10000000"},
		{[]string{"--long-poll-max-wait", "2m"}, nil, "--long-poll-max-wait 2m0s: want whole seconds from 0 (off) to 50s"},
		{[]string{"--long-poll-max-wait", "1500ms"}, nil, "--long-poll-max-wait 1.5s: want whole seconds"},
		{nil, map[string]string{"KUBE_BIND_MAX_LONG_POLLS": "0"}, "--max-long-polls 0: must be positive"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--tls-cert-file", "/x"}, nil, "go together"},
		{[]string{"--pretty-name", " "}, nil, "--pretty-name"},
		{[]string{"stray"}, nil, "unexpected arguments"},
		{[]string{"--cluster-secret-key", base64.StdEncoding.EncodeToString(make([]byte, 16))}, nil, "--cluster-secret-key: decodes to 16 bytes"},
		{[]string{"--credential-lifetime", "5m"}, nil, "--credential-lifetime 5m0s: must be at least 10m0s"},
		{[]string{"--binding-lifetime", "47h"}, nil, "--binding-lifetime 47h0m0s: must be 0 (never) or at least 2 credential lifetimes"},
		{[]string{"--credential-rotation-point", "1"}, nil, "--credential-rotation-point 1: want a fraction"},
		{[]string{"--credential-rotation-point", "0"}, nil, "--credential-rotation-point 0: want a fraction"},
		{[]string{"--credential-overlap", "0s"}, nil, "--credential-overlap 0s: must be positive"},
		{[]string{"--credential-lifetime", "10m", "--credential-overlap", "3m"}, nil, "must be shorter than what remains of a token after its rotation (2m0s"},
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
	// Several mistakes are reported together.
	_, err = parseConfig([]string{"--log-format=xml", "--consumer-scope=x"}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--log-format") || !strings.Contains(err.Error(), "--consumer-scope") {
		t.Errorf("joined errors: %v", err)
	}
	if _, err := parseConfig([]string{"--help"}, env(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

// TestCLITokenFlags: --cli-token-ttl (8h, 15m to 24h) and
// --cli-tokens-not-before (RFC 3339), from flags or the environment.
func TestCLITokenFlags(t *testing.T) {
	c := mustParse(t, nil, nil)
	if c.CLITokenTTL != 8*time.Hour || !c.CLITokensNotBefore.IsZero() {
		t.Errorf("defaults: %s %s", c.CLITokenTTL, c.CLITokensNotBefore)
	}
	c = mustParse(t, []string{"--cli-token-ttl=15m"}, map[string]string{"KUBE_BIND_CLI_TOKENS_NOT_BEFORE": "2026-11-26T10:00:00Z"})
	if c.CLITokenTTL != 15*time.Minute || !c.CLITokensNotBefore.Equal(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("set: %s %s", c.CLITokenTTL, c.CLITokensNotBefore)
	}
	for _, args := range [][]string{{"--cli-token-ttl=14m59s"}, {"--cli-token-ttl=24h1s"}, {"--cli-tokens-not-before=yesterday"}} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), strings.SplitN(args[0], "=", 2)[0]) {
			t.Errorf("%q: %v", args, err)
		}
	}
}
