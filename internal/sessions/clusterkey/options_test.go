package clusterkey

import (
	"bytes"
	"encoding/base64"
	"reflect"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// The cluster secret key: random (and flagged) when unset, else the
// configured ones; Complete and New accept the same lengths.
func TestOptions(t *testing.T) {
	o, err := flagvalue.ParseNew[Options]()
	if err != nil || len(o.Keys) != 1 || len(o.Keys[0]) != 32 || !o.Generated {
		t.Errorf("cluster secret key not generated: %d keys, generated %v, %v", len(o.Keys), o.Generated, err)
	}
	key := bytes.Repeat([]byte{9}, 48)
	if o, err := flagvalue.ParseNew[Options]("--cluster-secret-key=" + base64.StdEncoding.EncodeToString(key)); err != nil || !reflect.DeepEqual(o.Keys, [][]byte{key}) || o.Generated {
		t.Errorf("cluster secret keys %x (generated %v), %v", o.Keys, o.Generated, err)
	}
	for _, n := range []int{16, 31, 32, 40, 48, 64, 65} {
		k := bytes.Repeat([]byte{1}, n)
		_, err := flagvalue.ParseNew[Options]("--cluster-secret-key=" + base64.StdEncoding.EncodeToString(k))
		_, newErr := New(k)
		if (err == nil) != (newErr == nil) {
			t.Errorf("a key of %d bytes: Complete %v, New %v", n, err, newErr)
		}
	}
	if _, err := flagvalue.ParseNew[Options]("--cluster-secret-key", base64.StdEncoding.EncodeToString(make([]byte, 16))); err == nil ||
		!strings.Contains(err.Error(), "--cluster-secret-key: decodes to 16 bytes, want 32 or 48 or 64") {
		t.Errorf("short key: %v", err)
	}
}
