package cleanup

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// MinGCAfter keeps the garbage collection away from binds in progress and
// from responses still waiting for their poll.
const MinGCAfter = time.Hour

// Options are the operator's garbage collection flags.
type Options struct {
	// UnusedBindingAfter is Config.GCAfter; 0 turns the collection off.
	UnusedBindingAfter time.Duration
	DryRun             bool
}

// AddFlags registers the flags, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.UnusedBindingAfter, "gc-unused-binding-after", 24*time.Hour, "delete a consumer namespace left by a bind cut short, or by a bind whose response was never handed out, this long after it was made; never one whose konnector sent a heartbeat or whose credentials were used; 0 turns it off (at least 1h and longer than a session lives)")
	fs.BoolVar(&o.DryRun, "gc-dry-run", false, "only log (and count) the unused bindings the garbage collection would delete")
}

// Validate checks the options: off (0), or at least MinGCAfter and
// longer than the session TTL, since a complete
// binding's response can be handed out as long as its session lives. New
// takes shorter times, for tests.
func (o Options) Validate(sessionTTL time.Duration) []error {
	switch after := o.UnusedBindingAfter; {
	case after < 0:
		return []error{fmt.Errorf("--gc-unused-binding-after %s: must be 0 (off) or positive", after)}
	case after == 0 && o.DryRun:
		return []error{errors.New("--gc-dry-run: the garbage collection is off (--gc-unused-binding-after=0); nothing to try")}
	case after == 0:
		return nil
	case after < MinGCAfter:
		return []error{fmt.Errorf("--gc-unused-binding-after %s: must be at least %s (or 0 for off)", after, MinGCAfter)}
	case after <= sessionTTL:
		return []error{fmt.Errorf("--gc-unused-binding-after %s: must be longer than the session TTL %s (a response can be handed out until its session ends)",
			after, sessionTTL)}
	}
	return nil
}
