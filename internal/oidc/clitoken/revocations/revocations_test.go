package revocations

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestParse(t *testing.T) {
	t1 := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Hour)
	got, errs := Parse(map[string]string{
		"alice":       "2026-12-02T11:00:00Z alice-sub",
		"alice-later": "2026-12-02T12:00:00Z alice-sub\n",
		"spaces":      "2026-12-02T11:00:00Z a subject with spaces",
		"offset":      "2026-12-02T12:00:00+01:00 bob",
		"no-subject":  "2026-12-02T11:00:00Z ",
		"no-time":     "carol",
		"bad-time":    "yesterday carol",
		"long":        "2026-12-02T11:00:00Z " + strings.Repeat("x", 256),
		"bad-utf8":    "2026-12-02T11:00:00Z \xff",
	})
	if !got["alice-sub"].Equal(t2) || !got["a subject with spaces"].Equal(t1) || !got["bob"].Equal(t1) || len(got) != 3 {
		t.Errorf("parsed %v", got)
	}
	if len(errs) != 5 {
		t.Errorf("problems %v, want one for each of the 5 bad entries", errs)
	}
	for _, e := range errs {
		if !strings.HasPrefix(e.Error(), "entry ") {
			t.Errorf("problem %q does not name its entry", e)
		}
	}
}

// FuzzParse: any ConfigMap data parses without panicking, and every
// subject it yields is one valid line of at most 255 bytes.
func FuzzParse(f *testing.F) {
	f.Add("k", "2026-12-02T11:00:00Z alice")
	f.Add("k", "2026-12-02T11:00:00Z  two spaces")
	f.Add("k", " ")
	f.Add("k", "2026-12-02T11:00:00+14:00 x\r\n")
	f.Fuzz(func(t *testing.T, key, value string) {
		got, errs := Parse(map[string]string{key: value})
		if len(got)+len(errs) != 1 {
			t.Fatalf("one entry gave %d subjects and %d problems", len(got), len(errs))
		}
		for s, nb := range got {
			if s == "" || len(s) > maxSubject || !utf8.ValidString(s) || strings.ContainsAny(s, "\r\n") || nb.IsZero() {
				t.Fatalf("subject %q, not before %v", s, nb)
			}
		}
	})
}
