package flagvalue

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeFile(t *testing.T, name string, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Key rotation: a flag takes several base64 keys, one per line in its
// file (or separated by white space in its value), the first current;
// each key is checked on its own, and an error names the flag and the
// key's position, never the key.
func TestKeys(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	newSign, oldSign := bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 32)
	newEnc, oldEnc, olderEnc := bytes.Repeat([]byte{3}, 16), bytes.Repeat([]byte{4}, 32), bytes.Repeat([]byte{5}, 24)
	newCluster, oldCluster := bytes.Repeat([]byte{6}, 48), bytes.Repeat([]byte{7}, 32)
	for _, c := range []struct {
		value, file string
		lengths     []int
		want        [][]byte
	}{
		{"", writeFile(t, "sign", b64(newSign), b64(oldSign)), []int{32, 64}, [][]byte{newSign, oldSign}},
		{"", writeFile(t, "cluster", "", "  "+b64(newCluster)+"\r", base64.RawURLEncoding.EncodeToString(oldCluster)), []int{32, 48, 64}, [][]byte{newCluster, oldCluster}},
		{b64(newEnc) + " " + b64(oldEnc) + "\n" + b64(olderEnc), "", []int{16, 24, 32}, [][]byte{newEnc, oldEnc, olderEnc}},
		{"", "", []int{32}, nil},
	} {
		got, err := Keys("some-key", c.value, c.file, c.lengths...)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Keys(%q, %q) = %x, %v; want %x", c.value, c.file, got, err, c.want)
		}
	}

	short := b64(bytes.Repeat([]byte{9}, 20))
	for _, c := range []struct {
		name, value, file string
		lengths           []int
		want              []string
	}{
		{"cookie-signing-key", "", writeFile(t, "short2", b64(newSign), short), []int{32, 64},
			[]string{"--cookie-signing-key: key 2 decodes to 20 bytes, want 32 or 64"}},
		{"cluster-secret-key", b64(newCluster) + " " + short, "", []int{32, 48, 64},
			[]string{"--cluster-secret-key: key 2 decodes to 20 bytes, want 32 or 48 or 64"}},
		{"cookie-encryption-key", "!!!notbase64 " + b64(newEnc) + " " + short, "", []int{16, 24, 32}, []string{
			"--cookie-encryption-key: key 1 is not base64", "--cookie-encryption-key: key 3 decodes to 20 bytes, want 16 or 24 or 32"}},
		{"one-key", "!!!notbase64", "", []int{32}, []string{"--one-key: not base64"}},
		// openssl rand -base64 64 breaks its output after 64 characters.
		{"cookie-signing-key", "", writeFile(t, "wrapped", b64(newSign)[:64], b64(newSign)[64:]), []int{32, 64}, []string{
			"--cookie-signing-key: key 1 decodes to 48 bytes", "is a key broken over several lines? Make one with: openssl rand -base64 64 | tr -d '\\n'"}},
		{"some-key", "x", "/x", []int{32}, []string{"--some-key and --some-key-file: give only one"}},
		{"some-key", "", filepath.Join(t.TempDir(), "missing"), []int{32}, []string{"--some-key-file: "}},
		{"some-key", "", writeFile(t, "empty", " "), []int{32}, []string{"is empty"}},
	} {
		_, err := Keys(c.name, c.value, c.file, c.lengths...)
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Keys(%s, %q, %q) = %v, want an error containing %q", c.name, c.value, c.file, err, want)
			}
		}
		if err != nil && (strings.Contains(err.Error(), short) || strings.Contains(err.Error(), b64(newSign)[:20])) {
			t.Errorf("error %q shows a key", err)
		}
	}
}

func TestListAndHTTPURL(t *testing.T) {
	if got := List(" a, ,b ,"); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("List = %q", got)
	}
	for raw, want := range map[string]string{
		"https://x.example.com/p": "",
		"bind.example.com":        "must be an absolute http:// or https:// URL",
		"ftp://x":                 "must be an absolute",
		"https://u:p@x":           "must not carry user information",
		"::":                      "not a URL",
	} {
		_, err := HTTPURL(raw)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("HTTPURL(%q) = %v, want %q", raw, err, want)
		}
	}
}
