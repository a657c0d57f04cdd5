package kbindv2

import (
	"net/url"
	"testing"

	"github.com/kbprovider/backend/pkg/protocol"
)

// FuzzPickupQuery: the pickup's query comes from anybody. It is accepted
// only with s and k once each, URL-safe, and no other parameter but one
// format of yaml or json (yaml when absent); what is accepted, encoded
// again, reads back the same.
func FuzzPickupQuery(f *testing.F) {
	f.Add("s=Bo_WpqdppCyYQUVAuOXFfGBm1AADtEqXwQ&k=_okQM6kXy3ntkzko41gh0Ieo7JYs05l24DHI70apHRY")
	f.Add("s=a&k=b&format=json")
	f.Add("s=a&s=a&k=b")
	f.Add("s=a&k=b&format=")
	f.Add("%zz")
	f.Add("s=a%00&k=b")
	f.Fuzz(func(t *testing.T, raw string) {
		sid, secret, format, problem := pickupQuery(raw)
		if problem != "" {
			if sid != "" || secret != "" || format != "" {
				t.Fatalf("%q refused (%s) with values %q %q %q", raw, problem, sid, secret, format)
			}
			return
		}
		q, err := url.ParseQuery(raw)
		if err != nil || len(q["s"]) != 1 || len(q["k"]) != 1 || len(q["format"]) > 1 {
			t.Fatalf("%q accepted, but its parameters are not each once", raw)
		}
		if !protocol.URLSafe(sid, 128) || !protocol.URLSafe(secret, 128) || (format != formatYAML && format != formatJSON) {
			t.Fatalf("%q accepted as %q %q %q", raw, sid, secret, format)
		}
		if !q.Has("format") && format != formatYAML {
			t.Fatalf("%q without a format read as %q", raw, format)
		}
		again := url.Values{"s": {sid}, "k": {secret}, "format": {format}}.Encode()
		if s2, k2, f2, p2 := pickupQuery(again); p2 != "" || s2 != sid || k2 != secret || f2 != format {
			t.Fatalf("%q: its encoding %q reads back as %q %q %q %q", raw, again, s2, k2, f2, p2)
		}
	})
}
