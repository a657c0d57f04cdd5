package sessionkey

import (
	"bytes"
	"encoding/base64"
	"errors"
	"testing"
	"time"
)

var (
	keyA = bytes.Repeat([]byte("a"), 32)
	keyB = bytes.Repeat([]byte("b"), 32)
)

func mustKeys(t testing.TB, current []byte, previous ...[]byte) *Keys {
	t.Helper()
	k, err := New(current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestIssueOpen(t *testing.T) {
	k := mustKeys(t, keyA)
	exp := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	for _, cid := range []string{"", "aB3dE9", "abcdefghijklmnopqrstuvwxyz"} {
		s := k.Issue(FlowPoll, cid, exp)
		got, err := k.Open(s.ID)
		if err != nil {
			t.Fatalf("Open(%q): %v", s.ID, err)
		}
		if got != s || !got.ExpiresAt.Equal(exp) || got.ClusterID != cid || got.Flow != FlowPoll {
			t.Fatalf("Open = %+v, want %+v", got, s)
		}
		if len(s.ID) > MaxIDLen || len(s.Secret) != 43 {
			t.Fatalf("ID %q (%d), secret of %d characters", s.ID, len(s.ID), len(s.Secret))
		}
	}
	if a, b := k.Issue(FlowPoll, "", exp), k.Issue(FlowPoll, "", exp); a.ID == b.ID || a.Secret == b.Secret {
		t.Fatal("two sessions got the same ID or secret")
	}
	if s := k.Issue(FlowPoll, "not a cluster id!", exp); s.ClusterID != "" {
		t.Fatalf("an invalid cluster ID was kept: %q", s.ClusterID)
	}
}

// TestAnyReplicaOpens: keys made from the same bytes (another replica, or
// this one after a restart) derive the same secret.
func TestAnyReplicaOpens(t *testing.T) {
	s := mustKeys(t, keyA).Issue(FlowCallback, "", time.Now().Add(time.Minute))
	got, err := mustKeys(t, keyA).Open(s.ID)
	if err != nil || got.Secret != s.Secret || got.Flow != FlowCallback {
		t.Fatalf("another instance opened %+v, %v", got, err)
	}
}

// TestFlows: every flow survives the round trip and names its
// generation; a flow byte this backend never issues is malformed.
func TestFlows(t *testing.T) {
	k := mustKeys(t, keyA)
	for _, tc := range []struct {
		flow                       Flow
		polled, v1alpha2, recorded bool
	}{
		{FlowPoll, true, false, true}, {FlowCallback, false, false, false},
		{FlowPollV1alpha2, true, true, true}, {FlowBrowserV1alpha2, false, true, false}, {FlowCLILogin, false, true, false},
		{FlowBrowserV2, false, false, true},
	} {
		s := k.Issue(tc.flow, "", time.Now().Add(time.Minute))
		got, err := k.Open(s.ID)
		if err != nil || got.Flow != tc.flow || got.Flow.Polled() != tc.polled || got.Flow.V1alpha2() != tc.v1alpha2 ||
			got.Flow.Recorded() != tc.recorded {
			t.Errorf("flow %d: %+v %v", tc.flow, got, err)
		}
	}
	for _, bad := range []Flow{0, 7, 255} {
		s := k.Issue(bad, "", time.Now().Add(time.Minute))
		if _, err := k.Open(s.ID); !errors.Is(err, ErrMalformed) {
			t.Errorf("flow %d opened: %v", bad, err)
		}
	}
}

func TestRotation(t *testing.T) {
	exp := time.Now().Add(time.Minute)
	old := mustKeys(t, keyA).Issue(FlowPoll, "", exp)
	rotated := mustKeys(t, keyB, keyA)
	got, err := rotated.Open(old.ID)
	if err != nil || got.Secret != old.Secret {
		t.Fatalf("the previous key no longer opens its session: %v", err)
	}
	fresh := rotated.Issue(FlowPoll, "", exp)
	if _, err := mustKeys(t, keyA).Open(fresh.ID); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a replica without the new key opened its session: %v", err)
	}
	if got, err := mustKeys(t, keyB).Open(fresh.ID); err != nil || got.Secret != fresh.Secret {
		t.Fatalf("the new key alone does not open its session: %v", err)
	}
}

func TestTamperedIDHasAnotherSecret(t *testing.T) {
	k := mustKeys(t, keyA)
	s := k.Issue(FlowPoll, "aB3dE9", time.Now().Add(time.Minute))
	b, _ := base64.RawURLEncoding.DecodeString(s.ID)
	b[8]++ // the expiry's last byte
	got, err := k.Open(base64.RawURLEncoding.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	if got.Secret == s.Secret {
		t.Fatal("a changed expiry kept the secret")
	}
}

func TestMalformed(t *testing.T) {
	k := mustKeys(t, keyA)
	s := k.Issue(FlowPoll, "", time.Now())
	for _, id := range []string{"", "abc", s.ID + "=", s.ID[:len(s.ID)-1] + "!", "Zr7Q2mWbX9kLp3Vt", string(make([]byte, 200)),
		s.ID[:10] + "\n" + s.ID[10:], s.ID[:10] + "\r\n" + s.ID[10:]} {
		if _, err := k.Open(id); !errors.Is(err, ErrMalformed) {
			t.Errorf("Open(%q) = %v, want ErrMalformed", id, err)
		}
	}
	if _, err := New(keyA[:31]); err == nil {
		t.Error("a 31-byte key was accepted")
	}
}

// FuzzOpen: Open never panics; what it accepts is canonical (one
// spelling per ID) and opens the same again.
func FuzzOpen(f *testing.F) {
	k := mustKeys(f, keyA)
	f.Add(k.Issue(FlowPoll, "", time.Now()).ID)
	f.Add(k.Issue(FlowCallback, "abcdefghijklmnopqrstuvwxyz", time.Now()).ID)
	f.Add(k.Issue(FlowCLILogin, "", time.Now()).ID)
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, id string) {
		s, err := k.Open(id)
		if err != nil {
			return
		}
		b, derr := base64.RawURLEncoding.DecodeString(id)
		if derr != nil || base64.RawURLEncoding.EncodeToString(b) != id || s.ID != id || len(s.Secret) != 43 {
			t.Fatalf("accepted a non-canonical ID %q", id)
		}
	})
}
