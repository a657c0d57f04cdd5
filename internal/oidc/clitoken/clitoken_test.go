package clitoken

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"
)

const issuer = "https://login.example.com"

var (
	keyA = bytes.Repeat([]byte("a"), 32)
	keyB = bytes.Repeat([]byte("b"), 32)
)

func newTokens(t testing.TB, clock *testutil.Clock, keys ...[]byte) *Tokens {
	t.Helper()
	tk, err := New(Config{SessionKeys: keys, Issuer: issuer, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestIssueVerify(t *testing.T) {
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	tk := newTokens(t, clock, keyA)
	tok, c, err := tk.Issue(issuer, User{Subject: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, Prefix) || strings.ContainsAny(tok, "=+/ ") || len(tok) > maxTokenLen {
		t.Fatalf("token %q", tok)
	}
	got, err := tk.Verify(tok)
	if err != nil || got.Subject != "alice" || got.ID != c.ID || len(got.ID) != 32 ||
		!got.ExpiresAt.Equal(clock.Now().Add(DefaultTTL)) || !got.IssuedAt.Equal(clock.Now()) {
		t.Fatalf("Verify: %+v, %v", got, err)
	}
	if _, c2, _ := tk.Issue(issuer, User{Subject: "alice"}); c2.ID == c.ID {
		t.Error("two tokens with one ID")
	}
	// Another replica (the same key bytes) verifies it.
	if _, err := newTokens(t, clock, keyA).Verify(tok); err != nil {
		t.Errorf("another replica: %v", err)
	}
	// Just before the expiry, then at it.
	clock.Advance(DefaultTTL - time.Second)
	if _, err := tk.Verify(tok); err != nil {
		t.Errorf("a second before the expiry: %v", err)
	}
	clock.Advance(time.Second)
	if _, err := tk.Verify(tok); !errors.Is(err, ErrExpired) {
		t.Errorf("at the expiry: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	tk := newTokens(t, clock, keyA)
	tok, _, _ := tk.Issue(issuer, User{Subject: "alice"})

	other, err := New(Config{SessionKeys: [][]byte{keyA}, Issuer: "https://other.example.com", Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Verify(tok); !errors.Is(err, ErrWrongIssuer) {
		t.Errorf("another issuer: %v", err)
	}
	if _, err := newTokens(t, clock, keyB).Verify(tok); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("unknown key: %v", err)
	}
	revoking, _ := New(Config{SessionKeys: [][]byte{keyA}, Issuer: issuer, Now: clock.Now, NotBefore: clock.Now().Add(time.Second)})
	if _, err := revoking.Verify(tok); !errors.Is(err, ErrRevoked) {
		t.Errorf("issued before not-before: %v", err)
	}
	atNotBefore, _ := New(Config{SessionKeys: [][]byte{keyA}, Issuer: issuer, Now: clock.Now, NotBefore: clock.Now()})
	if _, err := atNotBefore.Verify(tok); err != nil {
		t.Errorf("issued at not-before: %v", err)
	}
	future := newTokens(t, testutil.ClockAt(clock.Now().Add(time.Hour)), keyA)
	ftok, _, _ := future.Issue(issuer, User{Subject: "alice"})
	if _, err := tk.Verify(ftok); !errors.Is(err, ErrNotYetValid) {
		t.Errorf("issued an hour ahead: %v", err)
	}

	payload, sig, _ := strings.Cut(strings.TrimPrefix(tok, Prefix), ".")
	p, _ := base64.RawURLEncoding.DecodeString(payload)
	forged := func(mut func([]byte)) string {
		q := bytes.Clone(p)
		mut(q)
		return Prefix + base64.RawURLEncoding.EncodeToString(q) + "." + sig
	}
	for name, c := range map[string]struct {
		token string
		want  error
	}{
		"empty":            {"", ErrMalformed},
		"no prefix":        {strings.TrimPrefix(tok, Prefix), ErrMalformed},
		"other version":    {"kbt2." + strings.TrimPrefix(tok, Prefix), ErrMalformed},
		"no mac":           {Prefix + payload, ErrMalformed},
		"empty mac":        {Prefix + payload + ".", ErrMalformed},
		"three parts":      {tok + ".x", ErrMalformed},
		"padded mac":       {tok + "=", ErrMalformed},
		"line break":       {Prefix + payload[:10] + "\n" + payload[10:] + "." + sig, ErrMalformed},
		"standard base64":  {Prefix + payload + "." + base64.StdEncoding.EncodeToString(mustDecode(sig)), ErrMalformed},
		"short mac":        {Prefix + payload + "." + sig[:40], ErrMalformed},
		"other subject":    {forged(func(q []byte) { q[fixedLen] = 'x' }), ErrBadSignature},
		"later expiry":     {forged(func(q []byte) { q[20]++ }), ErrBadSignature},
		"length mismatch":  {forged(func(q []byte) { q[45]++ }), ErrMalformed},
		"zero mac":         {Prefix + payload + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 32)), ErrBadSignature},
		"too long":         {tok + strings.Repeat("A", maxTokenLen), ErrMalformed},
		"unused bits set":  {Prefix + payload + "." + sig[:42] + bumpLast(sig[42]), ErrMalformed},
		"bearer in string": {"Bearer " + tok, ErrMalformed},
	} {
		if _, err := tk.Verify(c.token); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func mustDecode(s string) []byte {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// bumpLast returns the last character of a 32-byte base64url spelling
// with one of its two unused low bits set.
func bumpLast(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return string(alphabet[strings.IndexByte(alphabet, c)|1])
}

// TestRotation: the first key issues, every key verifies.
func TestRotation(t *testing.T) {
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	old := newTokens(t, clock, keyA)
	oldTok, _, _ := old.Issue(issuer, User{Subject: "alice"})
	rotated := newTokens(t, clock, keyB, keyA)
	if _, err := rotated.Verify(oldTok); err != nil {
		t.Fatalf("a token of the previous key: %v", err)
	}
	newTok, _, _ := rotated.Issue(issuer, User{Subject: "alice"})
	if _, err := old.Verify(newTok); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("the old replica verified a token of the new key: %v", err)
	}
	if _, err := newTokens(t, clock, keyB).Verify(oldTok); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("the old key removed, its token: %v", err)
	}
}

func TestConfig(t *testing.T) {
	for _, ttl := range []time.Duration{MinTTL - time.Second, MaxTTL + time.Second, -time.Hour} {
		if _, err := New(Config{SessionKeys: [][]byte{keyA}, Issuer: issuer, TTL: ttl}); err == nil {
			t.Errorf("TTL %s accepted", ttl)
		}
	}
	for _, ttl := range []time.Duration{MinTTL, MaxTTL, time.Hour} {
		if tk, err := New(Config{SessionKeys: [][]byte{keyA}, Issuer: issuer, TTL: ttl}); err != nil || tk.TTL() != ttl {
			t.Errorf("TTL %s: %v", ttl, err)
		}
	}
	if _, err := New(Config{SessionKeys: [][]byte{keyA[:31]}, Issuer: issuer}); err == nil {
		t.Error("a 31-byte key was accepted")
	}
	if _, err := New(Config{Issuer: issuer}); err == nil {
		t.Error("no keys accepted")
	}
	if _, err := New(Config{SessionKeys: [][]byte{keyA}}); err == nil {
		t.Error("no issuer accepted")
	}
	tk := newTokens(t, testutil.ClockAt(time.Now()), keyA)
	for _, sub := range []string{"", strings.Repeat("x", 256), "\xff"} {
		if _, _, err := tk.Issue(issuer, User{Subject: sub}); err == nil {
			t.Errorf("subject %q issued", sub)
		}
	}
	if _, _, err := tk.Issue("https://other.example.com", User{Subject: "alice"}); !errors.Is(err, ErrWrongIssuer) {
		t.Errorf("another issuer's subject: %v", err)
	}
	if tok, _, err := tk.Issue(issuer, User{Subject: strings.Repeat("x", 255)}); err != nil || len(tok) > maxTokenLen {
		t.Errorf("the longest subject: %d bytes, %v", len(tok), err)
	}
}

// FuzzVerify: Verify never panics, and accepts only tokens this backend
// made, in their one spelling: an accepted token is exactly the token its
// claims encode to again under the same key.
func FuzzVerify(f *testing.F) {
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	tk := newTokens(f, clock, keyA, keyB)
	for _, sub := range []string{"alice", "x", strings.Repeat("s", 255), "ünïcode"} {
		tok, _, _ := tk.Issue(issuer, User{Subject: sub})
		f.Add(tok)
		f.Add(tok + "=")
		f.Add(strings.ToUpper(tok))
	}
	prev, _, _ := newTokens(f, clock, keyB).Issue(issuer, User{Subject: "bob"})
	f.Add(prev)
	full, _, _ := tk.Issue(issuer, User{Subject: "carol", Email: "carol@example.com", Groups: []string{"devs", "ops"}, GroupsKnown: true})
	f.Add(full)
	f.Add(subjectOnlyToken(tk, "dave"))
	f.Add("kbt1..")
	f.Add("kbt1.AQ.AA")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := tk.Verify(token)
		if err != nil {
			if !reflect.DeepEqual(c, Claims{}) {
				t.Fatalf("claims %+v with error %v", c, err)
			}
			return
		}
		var secret []byte
		for _, k := range tk.keys {
			if k.id == c.keyID {
				secret = k.secret
			}
		}
		if again := tk.encode(secret, c); again != token {
			t.Fatalf("accepted %q, which encodes again as %q", token, again)
		}
		if !c.ExpiresAt.After(clock.Now()) || c.Subject == "" {
			t.Fatalf("accepted claims %+v", c)
		}
	})
}

// subjectOnlyToken is a token of the previous format (version 1: the
// subject only), as a backend of the previous release issued it.
func subjectOnlyToken(tk *Tokens, subject string) string {
	now := tk.now().Truncate(time.Second)
	c := Claims{User: User{Subject: subject}, IssuedAt: now, ExpiresAt: now.Add(tk.ttl), version: versionSubject, keyID: tk.keys[0].id}
	return tk.encode(tk.keys[0].secret, c)
}

// A token carries the verified address and the groups of the login, so
// that a bind made with it is judged and recorded like a browser bind;
// what does not fit the token leaves the groups unknown, never partial.
func TestUserCarried(t *testing.T) {
	tk := newTokens(t, testutil.ClockAt(time.Now()), keyA)
	many := make([]string, MaxGroups+1)
	for i := range many {
		many[i] = fmt.Sprintf("g%d", i)
	}
	for _, tc := range []struct {
		name string
		in   User
		want User
	}{
		{"all", User{Subject: "a", Email: "a@example.com", Groups: []string{"devs", "ops"}, GroupsKnown: true},
			User{Subject: "a", Email: "a@example.com", Groups: []string{"devs", "ops"}, GroupsKnown: true}},
		{"no groups, known", User{Subject: "a", GroupsKnown: true}, User{Subject: "a", GroupsKnown: true}},
		{"groups not known", User{Subject: "a", Groups: []string{"devs"}}, User{Subject: "a"}},
		{"too many groups", User{Subject: "a", Groups: many, GroupsKnown: true}, User{Subject: "a"}},
		{"too long in all", User{Subject: "a", Groups: []string{strings.Repeat("g", 250), strings.Repeat("h", 250), strings.Repeat("i", 250), strings.Repeat("j", 250), strings.Repeat("k", 250)}, GroupsKnown: true}, User{Subject: "a"}},
		{"a group too long", User{Subject: "a", Groups: []string{strings.Repeat("g", 256)}, GroupsKnown: true}, User{Subject: "a"}},
		{"an empty group", User{Subject: "a", Groups: []string{""}, GroupsKnown: true}, User{Subject: "a"}},
		{"address too long", User{Subject: "a", Email: strings.Repeat("e", 256)}, User{Subject: "a"}},
	} {
		tok, issued, err := tk.Issue(issuer, tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := tk.Verify(tok)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(got.User, tc.want) || !reflect.DeepEqual(issued.User, tc.want) {
			t.Errorf("%s: verified %+v, issued %+v, want %+v", tc.name, got.User, issued.User, tc.want)
		}
		if len(tok) > maxTokenLen {
			t.Errorf("%s: token of %d bytes, longer than %d", tc.name, len(tok), maxTokenLen)
		}
	}
	// The previous release's tokens still verify, with nothing known
	// beyond the subject.
	got, err := tk.Verify(subjectOnlyToken(tk, "dave"))
	if err != nil || !reflect.DeepEqual(got.User, User{Subject: "dave"}) {
		t.Errorf("version 1 token: %+v, %v", got.User, err)
	}
}

// revs is a Revocations of fixed times (or a fixed error).
type revs struct {
	notBefore map[string]time.Time
	err       error
}

func (r revs) NotBefore(subject string) (time.Time, error) { return r.notBefore[subject], r.err }

// One user's revocation refuses that user's tokens issued before it and
// nobody else's; a token issued after it works; Revocations that cannot
// answer make Verify fail with ErrUnjudged, never let a token through.
func TestUserRevocation(t *testing.T) {
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	r := &revs{notBefore: map[string]time.Time{}}
	tk, err := New(Config{SessionKeys: [][]byte{keyA}, Issuer: issuer, Now: clock.Now, Revocations: r})
	if err != nil {
		t.Fatal(err)
	}
	alice, _, _ := tk.Issue(issuer, User{Subject: "alice"})
	bob, _, _ := tk.Issue(issuer, User{Subject: "bob"})
	clock.Advance(time.Minute)
	r.notBefore["alice"] = clock.Now()
	if _, err := tk.Verify(alice); !errors.Is(err, ErrUserRevoked) {
		t.Errorf("alice's old token: %v, want ErrUserRevoked", err)
	}
	if c, err := tk.Verify(bob); err != nil || c.Subject != "bob" {
		t.Errorf("bob's token: %v", err)
	}
	clock.Advance(time.Second)
	fresh, _, _ := tk.Issue(issuer, User{Subject: "alice"})
	if _, err := tk.Verify(fresh); err != nil {
		t.Errorf("alice's token issued after the revocation: %v", err)
	}
	r.err = errors.New("not read yet")
	if _, err := tk.Verify(bob); !errors.Is(err, ErrUnjudged) {
		t.Errorf("revocations unknown: %v, want ErrUnjudged", err)
	}
}
