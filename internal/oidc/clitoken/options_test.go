package clitoken

import (
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// --cli-token-ttl (8h, 15m to 24h), --cli-tokens-not-before (RFC 3339),
// --cli-token-revocations (<namespace>/<name>) and the per-user rates.
func TestOptions(t *testing.T) {
	if o, err := flagvalue.ParseNew[Options](); err != nil || o.TTL != 8*time.Hour || !o.NotBefore.IsZero() ||
		o.RevocationsName != "" || o.RequestRate != 5 || o.BindRate != 20 {
		t.Errorf("defaults: %+v %v", o, err)
	}
	o, err := flagvalue.ParseNew[Options]("--cli-token-ttl=15m", "--cli-tokens-not-before=2026-11-26T10:00:00Z",
		"--cli-token-revocations=kube-bind/revoked", "--cli-token-request-rate=0", "--cli-token-bind-rate=0.5")
	if err != nil || o.TTL != 15*time.Minute || !o.NotBefore.Equal(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)) ||
		o.RevocationsNamespace != "kube-bind" || o.RevocationsName != "revoked" || o.RequestRate != 0 || o.BindRate != 0.5 {
		t.Errorf("set: %+v %v", o, err)
	}
	for _, args := range [][]string{{"--cli-token-ttl=14m59s"}, {"--cli-token-ttl=24h1s"}, {"--cli-tokens-not-before=yesterday"},
		{"--cli-token-revocations=revoked"}, {"--cli-token-revocations=Kube_Bind/x"}, {"--cli-token-request-rate=-1"},
		{"--cli-token-bind-rate=NaN"}, {"--cli-token-bind-rate=+Inf"}} {
		if _, err := flagvalue.ParseNew[Options](args...); err == nil || !strings.Contains(err.Error(), strings.SplitN(args[0], "=", 2)[0]) {
			t.Errorf("%q: %v", args, err)
		}
	}
}
