package main

import (
	"fmt"
	"time"
)

// minGCAfter keeps the garbage collection away from binds in progress and
// from responses still waiting for their poll.
const minGCAfter = time.Hour

// validateGC checks --gc-unused-binding-after and --gc-dry-run. A complete
// binding's response can be handed out as long as its session lives, so
// the collection must wait longer than --session-ttl.
func (r *rawFlags) validateGC(c *config) []error {
	after := r.gcUnusedBindingAfter
	c.GCUnusedBindingAfter, c.GCDryRun = after, r.gcDryRun
	var errs []error
	switch {
	case after < 0:
		errs = append(errs, fmt.Errorf("--gc-unused-binding-after %s: must be 0 (off) or positive", after))
	case after == 0:
		if r.gcDryRun {
			errs = append(errs, fmt.Errorf("--gc-dry-run: the garbage collection is off (--gc-unused-binding-after=0); nothing to try"))
		}
	case after < minGCAfter:
		errs = append(errs, fmt.Errorf("--gc-unused-binding-after %s: must be at least %s (or 0 for off)", after, minGCAfter))
	case after <= r.sessionTTL:
		errs = append(errs, fmt.Errorf("--gc-unused-binding-after %s: must be longer than --session-ttl %s (a response can be handed out until its session ends)",
			after, r.sessionTTL))
	}
	return errs
}
