package browser

import (
	"bytes"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/testutil/fakes"
)

// A rotation of the cookie keys: a login cookie made with the old pair
// still opens where the new keys are current and the old ones listed
// (whichever of the two keys rotates, or both), not where the old ones
// are dropped; a new cookie is made with the current pair.
func TestLoginCookieKeyRotation(t *testing.T) {
	key := func(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }
	oldHash, newHash := key('h', 32), key('H', 64)
	oldBlock, newBlock := key('b', 16), key('B', 32)
	lc := loginCookie{Flow: flow{SessionID: "Zr7Q2mWbX9kLp3Vt", ClusterID: "k2d6r3xqz7m5a4wbe6ty3nvu5q"},
		Issuer: "https://idp.example.com", Subject: "alice", Email: "alice@example.com", EmailVerified: true,
		Groups: []string{"team-a"}, GroupsKnown: true, CSRF: newCSRFToken()}
	codecs := func(hash, block [][]byte) cookieCodecs { return newCookieCodecs(hash, block, 600) }
	encode := func(cs cookieCodecs) string {
		t.Helper()
		v, err := cs.Encode(loginCookieName, lc)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	opens := func(cs cookieCodecs, v string) bool {
		var got loginCookie
		return cs.Decode(loginCookieName, v, &got) == nil && reflect.DeepEqual(got, lc)
	}

	oldCookie := encode(codecs([][]byte{oldHash}, [][]byte{oldBlock}))
	for _, c := range []struct {
		name        string
		hash, block [][]byte
		opens       bool
	}{
		{"both rotating", [][]byte{newHash, oldHash}, [][]byte{newBlock, oldBlock}, true},
		{"signing key rotating", [][]byte{newHash, oldHash}, [][]byte{oldBlock}, true},
		{"encryption key rotating", [][]byte{oldHash}, [][]byte{newBlock, oldBlock}, true},
		{"lists of different lengths", [][]byte{newHash, key('x', 32), oldHash}, [][]byte{newBlock, oldBlock}, true},
		{"old keys dropped", [][]byte{newHash}, [][]byte{newBlock}, false},
		{"old signing key dropped", [][]byte{newHash}, [][]byte{newBlock, oldBlock}, false},
		{"old encryption key dropped", [][]byte{newHash, oldHash}, [][]byte{newBlock}, false},
	} {
		if got := opens(codecs(c.hash, c.block), oldCookie); got != c.opens {
			t.Errorf("%s: an old cookie opens: %v, want %v", c.name, got, c.opens)
		}
	}

	// New cookies: made with the current pair only.
	rotating := codecs([][]byte{newHash, oldHash}, [][]byte{newBlock, oldBlock})
	newCookie := encode(rotating)
	if !opens(codecs([][]byte{newHash}, [][]byte{newBlock}), newCookie) {
		t.Error("a new cookie is not made with the current keys")
	}
	if opens(codecs([][]byte{oldHash}, [][]byte{oldBlock}), newCookie) || opens(rotating, newCookie[:len(newCookie)-1]) {
		t.Error("a new cookie opens with the old keys, or cut short")
	}
}

// New checks every cookie key and names the one that is wrong.
func TestNewChecksCookieKeys(t *testing.T) {
	store := memory.New(sessions.Limits{}, nil)
	key, err := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := lifecycle.New(lifecycle.Config{Store: store, Keys: testSessionKeys(t), ClusterKey: key,
		SessionTTL: time.Hour, Catalog: fuzzCatalog, Provisioner: &fakes.Provisioner{}})
	if err != nil {
		t.Fatal(err)
	}
	hash, block := bytes.Repeat([]byte("h"), 32), bytes.Repeat([]byte("b"), 24)
	for _, c := range []struct {
		name        string
		hash, block [][]byte
		want        string
	}{
		{"one of each", [][]byte{hash}, [][]byte{block}, ""},
		{"several", [][]byte{hash, hash, hash}, [][]byte{block, block}, ""},
		{"no signing key", nil, [][]byte{block}, "a cookie signing key and a cookie encryption key are required"},
		{"no encryption key", [][]byte{hash}, nil, "a cookie signing key and a cookie encryption key are required"},
		{"short second signing key", [][]byte{hash, hash[:31]}, [][]byte{block}, "cookie signing key 2 has 31 bytes, want 32 or 64"},
		{"odd first encryption key", [][]byte{hash}, [][]byte{block[:20], block}, "cookie encryption key 1 has 20 bytes, want 16 or 24 or 32"},
	} {
		_, err := New(Config{
			ExternalURL: &url.URL{Scheme: "https", Host: "bind.example.com"}, Sessions: svc, Login: &fakes.Login{},
			CookieHashKeys: c.hash, CookieBlockKeys: c.block,
		})
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
