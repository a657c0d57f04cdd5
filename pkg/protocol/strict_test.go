package protocol

import (
	"net/url"
	"strconv"
	"testing"
)

func TestSingle(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  string
		ok    bool
	}{
		{"k=v", "v", true},
		{"k=v&other=x", "v", true},
		{"", "", false},
		{"k=", "", false},
		{"k", "", false},
		{"k=v&k=v", "", false},
		{"k=v&k=", "", false},
		{"K=v", "", false},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := Single(q, "k"); got != tc.want || ok != tc.ok {
			t.Errorf("Single(%q) = %q, %v; want %q, %v", tc.query, got, ok, tc.want, tc.ok)
		}
	}
}

func TestPort(t *testing.T) {
	for _, p := range []string{"1", "80", "8080", "65535"} {
		n, ok := Port(p)
		if !ok || strconv.Itoa(n) != p {
			t.Errorf("Port(%q) = %d, %v; want %s, true", p, n, ok, p)
		}
	}
	for _, p := range []string{"", "0", "00", "080", "65536", "99999", "100000", "+80", "-80", " 80", "80 ", "8_080", "0x50", "٨٠", "1e3"} {
		if n, ok := Port(p); ok {
			t.Errorf("Port(%q) = %d, true; want false", p, n)
		}
	}
}

// FuzzPort: Port takes exactly the decimal spellings of 1 to 65535 that
// strconv.Itoa writes.
func FuzzPort(f *testing.F) {
	for _, s := range []string{"1", "65535", "65536", "0", "+1", "01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := Port(s)
		m, err := strconv.Atoi(s)
		want := err == nil && m >= 1 && m <= 65535 && strconv.Itoa(m) == s
		if ok != want || (ok && n != m) {
			t.Fatalf("Port(%q) = %d, %v; want %v", s, n, ok, want)
		}
	})
}
