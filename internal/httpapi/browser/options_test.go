package browser

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestOptionsCookieKeys(t *testing.T) {
	o, err := flagvalue.ParseNew[Options]()
	if err != nil || len(o.SigningKeys) != 1 || len(o.SigningKeys[0]) != 32 || len(o.EncryptionKeys) != 1 || len(o.EncryptionKeys[0]) != 32 ||
		!slices.Equal(o.KeysGenerated, []string{"cookie-signing-key", "cookie-encryption-key"}) {
		t.Errorf("keys not generated: %+v %v", o, err)
	}
	sign := make([]byte, 64)
	for i := range sign {
		sign[i] = byte(i)
	}
	signFile := filepath.Join(t.TempDir(), "sign")
	if err := os.WriteFile(signFile, []byte(base64.StdEncoding.EncodeToString(sign)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	enc := bytes.Repeat([]byte{7}, 16)
	o, err = flagvalue.ParseNew[Options]("--cookie-signing-key-file="+signFile, "--cookie-encryption-key="+base64.RawURLEncoding.EncodeToString(enc))
	if err != nil || !reflect.DeepEqual(o.SigningKeys, [][]byte{sign}) || !reflect.DeepEqual(o.EncryptionKeys, [][]byte{enc}) || len(o.KeysGenerated) != 0 {
		t.Errorf("keys: %x %x %v %v", o.SigningKeys, o.EncryptionKeys, o.KeysGenerated, err)
	}
	// What Complete accepts, New accepts: one rule of each key's length.
	for _, n := range []int{16, 20, 24, 31, 32, 40, 48, 64, 65} {
		k := bytes.Repeat([]byte{1}, n)
		for _, c := range []struct {
			flag    string
			lengths []int
		}{{"--cookie-signing-key", SigningKeyLengths}, {"--cookie-encryption-key", EncryptionKeyLengths}} {
			_, err := flagvalue.ParseNew[Options](c.flag + "=" + base64.StdEncoding.EncodeToString(k))
			if newErr := checkKeys("key", [][]byte{k}, c.lengths); (err == nil) != (newErr == nil) {
				t.Errorf("%s of %d bytes: Complete %v, New's check %v", c.flag, n, err, newErr)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--cookie-signing-key", base64.StdEncoding.EncodeToString(make([]byte, 20))}, "decodes to 20 bytes, want 32 or 64"},
		{[]string{"--cookie-encryption-key", "!!!notbase64"}, "--cookie-encryption-key: not base64"},
		{[]string{"--cookie-signing-key", "a", "--cookie-signing-key-file", "/x"}, "give only one"},
	} {
		if _, err := flagvalue.ParseNew[Options](c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

func TestOptionsCallbackFlow(t *testing.T) {
	o, err := flagvalue.ParseNew[Options]("--callback-allowed-urls", "https://cli.example.com/cb, http://10.0.0.1:9000")
	if err != nil || !slices.Equal(o.CallbackAllowList, []string{"https://cli.example.com/cb", "http://10.0.0.1:9000"}) || o.NoCallbackFlow {
		t.Errorf("callback allow list %v, NoCallbackFlow %v, %v", o.CallbackAllowList, o.NoCallbackFlow, err)
	}
	if o, err := flagvalue.ParseNew[Options]("--callback-flow=false"); err != nil || !o.NoCallbackFlow || len(o.CallbackAllowList) != 0 {
		t.Errorf("--callback-flow=false: NoCallbackFlow %v, allow-list %v, %v; want the callback flow off", o.NoCallbackFlow, o.CallbackAllowList, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--callback-allowed-urls=cli.example.com"}, `--callback-allowed-urls: "cli.example.com"`},
		{[]string{"--callback-allowed-urls=https://x/cb?y=1"}, "--callback-allowed-urls"},
		{[]string{"--callback-allowed-urls=https://x/a/../cb"}, "matched exactly"},
		{[]string{"--callback-flow=false", "--callback-allowed-urls=https://cli.example.com/cb"}, "--callback-allowed-urls with --callback-flow=false"},
	} {
		if _, err := flagvalue.ParseNew[Options](c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
