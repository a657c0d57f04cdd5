package hashring

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"reflect"
	"testing"
)

// TestCodecsMatchEncodingJSON: for random messages, what the hand-written
// codecs write reads back with encoding/json as the same message, and
// what encoding/json writes reads back with the codecs as the same
// message, every field set or not. (Compared by encoding/json's encoding
// of the results, so nil and empty slices, which omitempty does not tell
// apart, count as equal.)
func TestCodecsMatchEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 3000; i++ {
		ok := roundTrips(t, random[peerRequest](r)) && roundTrips(t, random[peerResponse](r)) &&
			roundTrips(t, random[wireRecord](r)) && roundTrips(t, random[wireSession](r)) &&
			roundTrips(t, random[peerBatch](r)) && roundTrips(t, random[peerBatchResponse](r))
		if !ok {
			t.Fatalf("case %d", i)
		}
	}
}

func random[T any](r *rand.Rand) *T {
	v := new(T)
	reflect.ValueOf(v).Elem().Set(randomValue(reflect.TypeFor[T](), r, 0))
	return v
}

// roundTrips encodes v with the codec and decodes it with encoding/json
// into a, and the other way round into b; both must encode (with
// encoding/json) as v does.
func roundTrips[T any](t *testing.T, v *T) bool {
	t.Helper()
	a, b := new(T), new(T)
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := wireJSON.Marshal(v)
	if err != nil {
		t.Fatalf("codec encode: %v", err)
	}
	if err := json.Unmarshal(mine, a); err != nil {
		t.Fatalf("encoding/json reading the codec's %s: %v", mine, err)
	}
	if err := wireJSON.Unmarshal(want, b); err != nil {
		t.Fatalf("codec reading encoding/json's %s: %v", want, err)
	}
	gotA, _ := json.Marshal(a)
	gotB, _ := json.Marshal(b)
	if !bytes.Equal(gotA, want) {
		t.Logf("codec wrote %s\nwant %s\nread back as %s", mine, want, gotA)
		return false
	}
	if !bytes.Equal(gotB, want) {
		t.Logf("codec read %s\nas %s", want, gotB)
		return false
	}
	return true
}

// randomValue fills every field of a message type, each left zero (or nil)
// a third of the time, so omitted fields are covered too.
func randomValue(typ reflect.Type, r *rand.Rand, depth int) reflect.Value {
	v := reflect.New(typ).Elem()
	if r.Intn(3) == 0 && depth > 0 {
		return v
	}
	switch typ.Kind() {
	case reflect.Pointer:
		if depth > 3 {
			return v
		}
		v.Set(reflect.New(typ.Elem()))
		v.Elem().Set(randomValue(typ.Elem(), r, depth+1))
	case reflect.Struct:
		for i := 0; i < typ.NumField(); i++ {
			v.Field(i).Set(randomValue(typ.Field(i).Type, r, depth+1))
		}
	case reflect.Slice:
		if depth > 3 {
			return v
		}
		n := r.Intn(4)
		s := reflect.MakeSlice(typ, n, n)
		for i := 0; i < n; i++ {
			s.Index(i).Set(randomValue(typ.Elem(), r, depth+1))
		}
		v.Set(s)
	case reflect.String:
		const chars = "abcXYZ019-_:/.\"\\\n<>&é€"
		rs := []rune(chars)
		b := make([]rune, r.Intn(12))
		for i := range b {
			b[i] = rs[r.Intn(len(rs))]
		}
		v.SetString(string(b))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(r.Int63() - r.Int63())
	case reflect.Uint64:
		v.SetUint(r.Uint64())
	case reflect.Uint8:
		v.SetUint(uint64(r.Intn(256)))
	default:
		panic("randomValue: no generator for " + typ.String())
	}
	return v
}
