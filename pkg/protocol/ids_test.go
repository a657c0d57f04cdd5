package protocol

import (
	"encoding/base64"
	"testing"
	"time"
)

func TestGeneratedFormats(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		sid, sec, cid := NewSessionID(), NewSessionSecret(), NewClusterID()
		if len(sid) != SessionIDLen || !URLSafe(sid, 64) {
			t.Fatalf("session ID %q: want %d base64url characters", sid, SessionIDLen)
		}
		if b, err := base64.RawURLEncoding.DecodeString(sec); err != nil || len(b) != 32 {
			t.Fatalf("secret %q: want 32 bytes of base64url without padding, got %d, %v", sec, len(b), err)
		}
		if !IssuedClusterID(cid) || !ValidClusterID(cid) || CLIClusterID(cid) {
			t.Fatalf("cluster ID %q not recognised as issued", cid)
		}
		for _, s := range []string{sid, sec, cid} {
			if seen[s] {
				t.Fatalf("duplicate %q", s)
			}
			seen[s] = true
		}
	}
}

func TestValidClusterID(t *testing.T) {
	for id, want := range map[string]bool{
		"aZ09xY":                      true,  // released CLI
		"abcdefghijklmnopqrstuvwxyz":  true,  // issued, 26 chars
		"abcdefghijklmnopqrstuvwx27":  true,  // issued
		"":                            false, // empty
		"aZ09x":                       false, // too short
		"aZ09xY1":                     false, // 7 chars
		"aZ-9xY":                      false, // not base62
		"abcdefghijklmnopqrstuvwxy1":  false, // 1 is not base32
		"Abcdefghijklmnopqrstuvwxyz":  false, // upper case
		"abcdefghijklmnopqrstuvwxyz2": false,
		"../../etc/passwd":            false,
	} {
		if got := ValidClusterID(id); got != want {
			t.Errorf("ValidClusterID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestURLSafe(t *testing.T) {
	for _, c := range []struct {
		s    string
		max  int
		want bool
	}{
		{"abc-_XYZ09", 64, true},
		{"", 64, false},
		{"abc", 2, false},
		{"a b", 64, false},
		{"a+b", 64, false},
		{"a=b", 64, false},
	} {
		if got := URLSafe(c.s, c.max); got != c.want {
			t.Errorf("URLSafe(%q, %d) = %v, want %v", c.s, c.max, got, c.want)
		}
	}
}

func TestExpiringSessionID(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 10, 0, 0, time.UTC)
	a, b := NewExpiringSessionID(at), NewExpiringSessionID(at)
	if a == b || len(a) != ExpiringSessionIDLen || !URLSafe(a, 64) {
		t.Fatalf("IDs %q and %q", a, b)
	}
	got, ok := SessionIDExpiry(a)
	if !ok || !got.Equal(at) {
		t.Errorf("expiry of %q = %v, %v; want %v", a, got, ok, at)
	}
	// The last character of an expiring ID holds two spare bits, which must
	// be zero (found by FuzzIDs: "…B" decoded like "…A").
	spare := "Zr7Q2mWbX9kLp3VtZr7Q2mAAAAB"
	if _, ok := SessionIDExpiry(spare[:26] + "A"); !ok {
		t.Fatal("canonical ID refused")
	}
	for _, other := range []string{NewSessionID(), "", a[:26], a[:26] + "!", a + "A", spare} {
		if _, ok := SessionIDExpiry(other); ok {
			t.Errorf("SessionIDExpiry(%q) claims an expiry", other)
		}
	}
}
