package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// An http --external-url or --oidc-issuer-url outside loopback is
// accepted, with a WARN line at start-up that names the flag and says
// what travels unencrypted; on loopback (the demo, the tests) and with
// https there is none.
func TestWarnPlainHTTPOutsideLoopback(t *testing.T) {
	for _, c := range []struct {
		external, issuer string
		warn             []string // flags warned about
	}{
		{"https://bind.example.com", "https://idp.example.com", nil},
		{"http://bind.example.com", "https://idp.example.com", []string{"external-url"}},
		{"https://bind.example.com", "http://idp.example.com/realms/x", []string{"oidc-issuer-url"}},
		{"http://10.0.0.7:8080/kb", "http://192.168.1.2:5556", []string{"external-url", "oidc-issuer-url"}},
		{"http://[2001:db8::1]:8080", "", []string{"external-url"}},
		{"http://localhost.example.com", "", []string{"external-url"}},
		{"http://127.0.0.1.nip.io:8080", "", []string{"external-url"}},
		{"http://localhost:8080", "http://127.0.0.1:5556", nil},
		{"http://LocalHost", "http://127.1.2.3:9000", nil},
		{"http://[::1]:8080/kb", "http://localhost./dex", nil},
		{"", "", nil}, // derived from the listen address: internal/server warns itself
	} {
		args := []string{"--cookie-signing-key=" + strings.Repeat("A", 43), "--cookie-encryption-key=" + strings.Repeat("B", 43),
			"--cluster-secret-key=" + strings.Repeat("C", 43)}
		if c.external != "" {
			args = append(args, "--external-url="+c.external)
		}
		if c.issuer != "" {
			args = append(args, "--oidc-issuer-url="+c.issuer, "--oidc-issuer-client-id=backend", "--oidc-issuer-client-secret=s3cret")
		}
		recs, logged := flagWarnings(t, mustParse(t, args, nil), "external-url", "oidc-issuer-url")
		var warned []string
		for _, rec := range recs {
			warned = append(warned, rec.Flag)
			if !strings.Contains(rec.Msg, "--"+rec.Flag) || !strings.Contains(rec.Msg, "unencrypted") ||
				!strings.Contains(rec.Msg, "tokens") || !strings.Contains(rec.Msg, "cookies") {
				t.Errorf("%s %s: warning %q does not name the flag and say that tokens and cookies travel unencrypted", c.external, c.issuer, rec.Msg)
			}
		}
		if strings.Join(warned, ",") != strings.Join(c.warn, ",") {
			t.Errorf("external %q, issuer %q: warned about %q, want %q:\n%s", c.external, c.issuer, warned, c.warn, logged)
		}
	}
}

// The other URLs a browser is sent to with something secret are warned
// about too: --oidc-callback-url (login codes, cookies) and each
// --callback-allowed-urls entry (the binding's response) when http off
// loopback; never for https or loopback.
func TestWarnPlainHTTPCallbackURLs(t *testing.T) {
	for _, c := range []struct {
		args []string
		warn []string // "flag=url" of each warning, in order
	}{
		{[]string{"--oidc-callback-url=https://bind.example.com/callback", "--callback-allowed-urls=https://cli.example.com/cb"}, nil},
		{[]string{"--oidc-callback-url=http://localhost:8080/callback", "--callback-allowed-urls=http://127.0.0.1:9/cb,http://[::1]:9/cb"}, nil},
		{[]string{"--oidc-callback-url=http://bind.example.com/callback"}, []string{"oidc-callback-url=http://bind.example.com/callback"}},
		{[]string{"--callback-allowed-urls=https://cli.example.com/cb,http://cli.example.com/cb,http://10.1.2.3:8000/cb"},
			[]string{"callback-allowed-urls=http://cli.example.com/cb", "callback-allowed-urls=http://10.1.2.3:8000/cb"}},
	} {
		args := append([]string{"--cookie-signing-key=" + strings.Repeat("A", 43), "--cookie-encryption-key=" + strings.Repeat("B", 43),
			"--cluster-secret-key=" + strings.Repeat("C", 43), "--external-url=https://bind.example.com",
			"--oidc-issuer-url=https://idp.example.com", "--oidc-issuer-client-id=backend", "--oidc-issuer-client-secret=s3cret"}, c.args...)
		recs, logged := flagWarnings(t, mustParse(t, args, nil), "oidc-callback-url", "callback-allowed-urls")
		var warned []string
		for _, rec := range recs {
			warned = append(warned, rec.Flag+"="+rec.URL)
			if !strings.Contains(rec.Msg, "--"+rec.Flag) || !strings.Contains(rec.Msg, "unencrypted") || !strings.Contains(rec.Msg, "https") {
				t.Errorf("%q: warning %q does not name the flag and say what travels unencrypted", c.args, rec.Msg)
			}
		}
		if strings.Join(warned, " ") != strings.Join(c.warn, " ") {
			t.Errorf("%q: warned %q, want %q:\n%s", c.args, warned, c.warn, logged)
		}
	}
}

// flagWarning is a WARN line of warnDefaults about a flag.
type flagWarning struct {
	Level, Msg, Flag string
	URL              string `json:"callback_url"`
}

// flagWarnings runs warnDefaults on cfg and returns its WARN lines about
// flags (not the others, e.g. about the open-file limit of this machine)
// and all it logged.
func flagWarnings(t *testing.T, cfg *config, flags ...string) ([]flagWarning, string) {
	t.Helper()
	var buf bytes.Buffer
	warnDefaults(cfg, slog.New(slog.NewJSONHandler(&buf, nil)))
	var out []flagWarning
	for line := range strings.Lines(buf.String()) {
		var rec flagWarning
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Level == "WARN" && slices.Contains(flags, rec.Flag) {
			out = append(out, rec)
		}
	}
	return out, buf.String()
}
