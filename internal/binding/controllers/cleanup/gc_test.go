package cleanup

import (
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	provisioned := created.Add(time.Minute)
	after := 24 * time.Hour
	for _, c := range []struct {
		name string
		u    usage
		want verdict
	}{
		{"half-made", usage{created: created}, verdict{ReasonIncomplete, created.Add(after)}},
		{"complete, never delivered", usage{created: created, complete: true, provisionedAt: provisioned},
			verdict{ReasonUndelivered, provisioned.Add(after)}},
		{"complete, delivered", usage{created: created, complete: true, provisionedAt: provisioned, delivered: true}, verdict{}},
		{"complete, made by an older backend", usage{created: created, complete: true}, verdict{}},
		{"konnector heartbeated", usage{created: created, complete: true, provisionedAt: provisioned, heartbeat: true}, verdict{}},
		{"delivered and heartbeating", usage{created: created, complete: true, delivered: true, heartbeat: true}, verdict{}},
		{"credentials used", usage{created: created, complete: true, provisionedAt: provisioned, used: true}, verdict{}},
		{"half-made but used (a later bind failed)", usage{created: created, used: true}, verdict{}},
	} {
		if got := decide(c.u, after); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
