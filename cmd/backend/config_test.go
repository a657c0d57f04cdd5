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
		c.MaxPendingSessions != 10000 || c.LogLevel != slog.LevelInfo || c.LogFormat != "json" ||
		c.LongPoll.MaxWait != 30*time.Second || c.LongPoll.MaxHeld != 1000 {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.CookieSigningKey) != 32 || len(c.CookieEncryptionKey) != 32 || len(c.CookieKeysGenerated) != 2 {
		t.Errorf("cookie keys not generated: %d %d %v", len(c.CookieSigningKey), len(c.CookieEncryptionKey), c.CookieKeysGenerated)
	}
	if c2 := mustParse(t, nil, nil); bytes.Equal(c.CookieSigningKey, c2.CookieSigningKey) {
		t.Error("generated keys are not random")
	}
}

// The cluster secret key: random (and flagged) when unset, else the
// configured one; the credential flags' defaults and values.
func TestClusterKeyAndCredentials(t *testing.T) {
	c := mustParse(t, nil, nil)
	if len(c.ClusterSecretKey) != 32 || !c.ClusterSecretKeyGenerated {
		t.Errorf("cluster secret key not generated: %d bytes, generated %v", len(c.ClusterSecretKey), c.ClusterSecretKeyGenerated)
	}
	if c.Credentials != (credentials.Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute}) {
		t.Errorf("credential defaults %+v", c.Credentials)
	}
	key := bytes.Repeat([]byte{9}, 48)
	c = mustParse(t, []string{"--credential-lifetime=10m", "--credential-rotation-point=0.05", "--credential-overlap=20s"},
		map[string]string{"KUBE_BIND_CLUSTER_SECRET_KEY": base64.StdEncoding.EncodeToString(key)})
	if !bytes.Equal(c.ClusterSecretKey, key) || c.ClusterSecretKeyGenerated {
		t.Errorf("cluster secret key %x (generated %v)", c.ClusterSecretKey, c.ClusterSecretKeyGenerated)
	}
	if c.Credentials != (credentials.Policy{Lifetime: 10 * time.Minute, RotationPoint: 0.05, Overlap: 20 * time.Second}) {
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
	if c.OIDCClientSecret != "s3cret" || !bytes.Equal(c.CookieSigningKey, sign) || !bytes.Equal(c.CookieEncryptionKey, enc) ||
		len(c.CookieKeysGenerated) != 0 {
		t.Errorf("secrets: %q %x %x %v", c.OIDCClientSecret, c.CookieSigningKey, c.CookieEncryptionKey, c.CookieKeysGenerated)
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
		{nil, map[string]string{"KUBE_BIND_MAX_PENDING_SESSIONS": "many"}, "want a whole number"},
		{nil, map[string]string{"KUBE_BIND_COOKIE_SIGNING_KEY": "short"}, "--cookie-signing-key"},
		{[]string{"--listen-address", "8080"}, nil, "--listen-address"},
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
		{[]string{"--max-pending-sessions", "0"}, nil, "--max-pending-sessions"},
		{[]string{"--max-pending-sessions", "100000001"}, nil, "at most 100000000"},
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
