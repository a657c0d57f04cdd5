package credentials

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestPolicyFlags(t *testing.T) {
	parse := func(args ...string) (Policy, error) {
		var p Policy
		if err := flagvalue.Parse(args, p.AddFlags); err != nil {
			t.Fatalf("parsing %q: %v", args, err)
		}
		return p, errors.Join(p.Validate()...)
	}
	if p, err := parse(); err != nil || p != (Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute, BindingLifetime: 720 * time.Hour}) {
		t.Errorf("defaults %+v %v", p, err)
	}
	p, err := parse("--credential-lifetime=10m", "--credential-rotation-point=0.05", "--credential-overlap=20s", "--binding-lifetime=0")
	if err != nil || p != (Policy{Lifetime: 10 * time.Minute, RotationPoint: 0.05, Overlap: 20 * time.Second, BindingLifetime: 0}) {
		t.Errorf("set %+v %v", p, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--credential-lifetime", "5m"}, "--credential-lifetime 5m0s: must be at least 10m0s"},
		{[]string{"--binding-lifetime", "47h"}, "--binding-lifetime 47h0m0s: must be 0 (never) or at least 2 credential lifetimes"},
		{[]string{"--credential-rotation-point", "1"}, "--credential-rotation-point 1: want a fraction"},
		{[]string{"--credential-rotation-point", "0"}, "--credential-rotation-point 0: want a fraction"},
		{[]string{"--credential-overlap", "0s"}, "--credential-overlap 0s: must be positive"},
		{[]string{"--credential-lifetime", "10m", "--credential-overlap", "3m"}, "must be shorter than what remains of a token after its rotation (2m0s"},
	} {
		if _, err := parse(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
