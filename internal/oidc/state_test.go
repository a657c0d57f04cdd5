package oidc

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestStateRoundTripAndRefusals(t *testing.T) {
	key := []byte("k")
	now := time.Unix(1_800_000_000, 0)
	p := statePayload{ID: "id", Bind: bindingOf("cookie"), Nonce: "n", Exp: now.Add(time.Minute).Unix(), Data: []byte("flow")}
	s, err := signState(key, p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseState([][]byte{key}, s, now)
	if err != nil || got.ID != "id" || string(got.Data) != "flow" || !bindingMatches(got, "cookie") || bindingMatches(got, "other") {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if _, err := parseState([][]byte{[]byte("other")}, s, now); !errors.Is(err, ErrInvalidState) {
		t.Errorf("other key: %v", err)
	}
	if _, err := parseState([][]byte{key}, s, now.Add(time.Minute)); !errors.Is(err, ErrStateExpired) {
		t.Errorf("at expiry: %v", err)
	}
	if _, err := parseState([][]byte{key}, s+"A", now); !errors.Is(err, ErrInvalidState) {
		t.Errorf("longer signature: %v", err)
	}
	// Found by FuzzFinishCallbackQuery: base64 decoding skips line breaks.
	if _, err := parseState([][]byte{key}, s+"\n", now); !errors.Is(err, ErrInvalidState) {
		t.Errorf("signature with a line break: %v", err)
	}
	if _, err := parseState([][]byte{key}, s[:len(s)-2]+"\r\n"+s[len(s)-2:], now); !errors.Is(err, ErrInvalidState) {
		t.Errorf("signature with a line break inside: %v", err)
	}
	if _, err := parseState([][]byte{key}, strings.Repeat("x", maxStateLen+1), now); !errors.Is(err, ErrInvalidState) {
		t.Errorf("huge: %v", err)
	}
	// Signed by us but incomplete: refused as well.
	partial, _ := signState(key, statePayload{ID: "id", Exp: now.Add(time.Minute).Unix()})
	if _, err := parseState([][]byte{key}, partial, now); !errors.Is(err, ErrInvalidState) {
		t.Errorf("incomplete payload: %v", err)
	}
}

func FuzzParseState(f *testing.F) {
	key := []byte("k")
	s, _ := signState(key, statePayload{ID: "i", Bind: "b", Nonce: "n", Exp: 1 << 40})
	f.Add(s)
	f.Add("a.b")
	f.Fuzz(func(t *testing.T, state string) {
		p, err := parseState([][]byte{key}, state, time.Unix(0, 0))
		if err == nil && (p.ID == "" || p.Bind == "" || p.Nonce == "") {
			t.Fatalf("accepted incomplete state %q", state)
		}
	})
}

func BenchmarkParseState(b *testing.B) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	s, _ := signState(key, statePayload{ID: randomString(16), Bind: bindingOf("c"), Nonce: randomString(16), Exp: now.Add(time.Minute).Unix(), Data: []byte("session-id-0123456789")})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseState([][]byte{key}, s, now); err != nil {
			b.Fatal(err)
		}
	}
}
