package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestGCFlags(t *testing.T) {
	c := mustParse(t, nil, nil)
	if c.GCUnusedBindingAfter != 24*time.Hour || c.GCDryRun {
		t.Errorf("defaults: %s, dry run %v; want 24h, false", c.GCUnusedBindingAfter, c.GCDryRun)
	}
	c = mustParse(t, []string{"--gc-unused-binding-after=0"}, nil)
	if c.GCUnusedBindingAfter != 0 {
		t.Errorf("0 (off): %s", c.GCUnusedBindingAfter)
	}
	c = mustParse(t, nil, map[string]string{"KUBE_BIND_GC_UNUSED_BINDING_AFTER": "2h", "KUBE_BIND_GC_DRY_RUN": "true"})
	if c.GCUnusedBindingAfter != 2*time.Hour || !c.GCDryRun {
		t.Errorf("from the environment: %s, dry run %v", c.GCUnusedBindingAfter, c.GCDryRun)
	}
	for _, args := range [][]string{
		{"--gc-unused-binding-after=-1h"},
		{"--gc-unused-binding-after=30m"},
		{"--gc-unused-binding-after=90m", "--session-ttl=2h"},
		{"--gc-unused-binding-after=0", "--gc-dry-run"},
	} {
		_, err := parseConfig(args, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--gc-") {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}
