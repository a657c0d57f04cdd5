package cleanup

import (
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestGCFlags(t *testing.T) {
	parse := func(args ...string) Options {
		var o Options
		if err := flagvalue.Parse(args, o.AddFlags); err != nil {
			t.Fatalf("parsing %q: %v", args, err)
		}
		return o
	}
	sessionTTL := 10 * time.Minute
	if o := parse(); o.UnusedBindingAfter != 24*time.Hour || o.DryRun || len(o.Validate(sessionTTL)) > 0 {
		t.Errorf("defaults: %+v; want 24h, no dry run", o)
	}
	if o := parse("--gc-unused-binding-after=0"); o.UnusedBindingAfter != 0 || len(o.Validate(sessionTTL)) > 0 {
		t.Errorf("0 (off): %+v", o)
	}
	if o := parse("--gc-unused-binding-after=2h", "--gc-dry-run"); o.UnusedBindingAfter != 2*time.Hour || !o.DryRun || len(o.Validate(sessionTTL)) > 0 {
		t.Errorf("set: %+v", o)
	}
	for _, c := range []struct {
		args       []string
		sessionTTL time.Duration
	}{
		{[]string{"--gc-unused-binding-after=-1h"}, sessionTTL},
		{[]string{"--gc-unused-binding-after=30m"}, sessionTTL},
		{[]string{"--gc-unused-binding-after=90m"}, 2 * time.Hour},
		{[]string{"--gc-unused-binding-after=0", "--gc-dry-run"}, sessionTTL},
	} {
		if errs := parse(c.args...).Validate(c.sessionTTL); len(errs) != 1 || !strings.Contains(errs[0].Error(), "--gc-") {
			t.Errorf("%v (session TTL %s): %v, want an error naming the flag", c.args, c.sessionTTL, errs)
		}
	}
}
