package protocol

import (
	"encoding/base64"
	"regexp"
	"testing"
	"time"
)

var (
	clusterIDPattern = regexp.MustCompile(`^(?:[a-z2-7]{26}|[0-9A-Za-z]{6})$`)
	urlSafePattern   = regexp.MustCompile(`^[0-9A-Za-z_-]+$`)
)

// FuzzIDs: every parser of IDs agrees with the format it documents; an
// expiring session ID that is accepted re-encodes to itself (one spelling
// per ID); what the generators make, the parsers accept.
func FuzzIDs(f *testing.F) {
	at := time.Date(2026, 11, 21, 10, 10, 0, 0, time.UTC)
	for _, s := range []string{
		NewExpiringSessionID(at), NewSessionID(), NewClusterID(), NewSessionSecret(), "aB3dE9", "aB3dE", "aB3dE9!",
		"Zr7Q2mWbX9kLp3VtZr7Q2mAAAAB", "Zr7Q2mWbX9kLp3VtZr7Q2mAAAAA", "Zr7Q2mWbX9kLp3VtZr7Q2m\nAAAA", "",
		"abcdefghijklmnopqrstuvwxy1", "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
	} {
		f.Add(s, at.Unix(), 64)
	}
	f.Add("a", int64(-1), 0)
	f.Add("a", int64(1<<40), 1)
	f.Fuzz(func(t *testing.T, s string, unix int64, max int) {
		if got, want := ValidClusterID(s), clusterIDPattern.MatchString(s); got != want {
			t.Fatalf("ValidClusterID(%q) = %v, want %v", s, got, want)
		}
		if IssuedClusterID(s) && CLIClusterID(s) {
			t.Fatalf("%q is both kinds of cluster ID", s)
		}
		if got, want := URLSafe(s, max), len(s) <= max && urlSafePattern.MatchString(s); got != want {
			t.Fatalf("URLSafe(%q, %d) = %v, want %v", s, max, got, want)
		}
		if exp, ok := SessionIDExpiry(s); ok {
			b, err := base64.RawURLEncoding.DecodeString(s)
			if err != nil || len(b) != 20 || base64.RawURLEncoding.EncodeToString(b) != s {
				t.Fatalf("SessionIDExpiry accepted %q, which is not the canonical encoding of 20 bytes", s)
			}
			if !URLSafe(s, 64) || exp.Unix() < 0 || exp.Unix() > 1<<32-1 {
				t.Fatalf("%q: expiry %v", s, exp)
			}
		}
		// Generators: the ID carries the expiry (whole seconds, 32 bits).
		want := time.Unix(int64(uint32(unix)), 0)
		id := NewExpiringSessionID(time.Unix(unix, 0))
		if got, ok := SessionIDExpiry(id); !ok || !got.Equal(want) || len(id) != ExpiringSessionIDLen || !URLSafe(id, 64) {
			t.Fatalf("NewExpiringSessionID(%d) = %q: expiry %v, %v", unix, id, got, ok)
		}
	})
}
