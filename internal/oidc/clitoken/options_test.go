package clitoken

import (
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// --cli-token-ttl (8h, 15m to 24h) and --cli-tokens-not-before (RFC 3339).
func TestOptions(t *testing.T) {
	if o, err := flagvalue.ParseNew[Options](); err != nil || o.TTL != 8*time.Hour || !o.NotBefore.IsZero() {
		t.Errorf("defaults: %s %s %v", o.TTL, o.NotBefore, err)
	}
	o, err := flagvalue.ParseNew[Options]("--cli-token-ttl=15m", "--cli-tokens-not-before=2026-11-26T10:00:00Z")
	if err != nil || o.TTL != 15*time.Minute || !o.NotBefore.Equal(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("set: %s %s %v", o.TTL, o.NotBefore, err)
	}
	for _, args := range [][]string{{"--cli-token-ttl=14m59s"}, {"--cli-token-ttl=24h1s"}, {"--cli-tokens-not-before=yesterday"}} {
		if _, err := flagvalue.ParseNew[Options](args...); err == nil || !strings.Contains(err.Error(), strings.SplitN(args[0], "=", 2)[0]) {
			t.Errorf("%q: %v", args, err)
		}
	}
}
