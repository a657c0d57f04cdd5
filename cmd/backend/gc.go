package main

import "github.com/kbprovider/backend/internal/cleanup"

// validateGC hands --gc-unused-binding-after and --gc-dry-run to their
// owner's check (cleanup.ValidateGC).
func (r *rawFlags) validateGC(c *config) []error {
	c.GCUnusedBindingAfter, c.GCDryRun = r.gcUnusedBindingAfter, r.gcDryRun
	return cleanup.ValidateGC(r.gcUnusedBindingAfter, r.gcDryRun, r.sessionTTL)
}
