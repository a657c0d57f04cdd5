package exportrequests

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A message longer than the schema admits is cut to fit, on a rune
// boundary, with the cut marked; a short one is kept whole.
func TestCutMessage(t *testing.T) {
	if got := cutMessage("short"); got != "short" {
		t.Errorf("short message: %q", got)
	}
	long := strings.Repeat("ü", maxMessage) // two bytes each
	got := cutMessage(long)
	if len(got) > maxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got) < maxMessage-4 {
		t.Errorf("cut message: %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-4:])
	}
}
