package heartbeats

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Options are the operator's health flags.
type Options struct {
	// Leases is !Config.NoLeases.
	Leases bool
	// LeaseTolerance is Config.LeaseTolerance.
	LeaseTolerance time.Duration
}

// AddFlags registers the flags, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Leases, "heartbeat-leases", true, "read the kbind v2 konnectors' heartbeat Leases in namespace kbind (needs list and watch of Leases there: the chart's kbindV2.leases); false: v2 bindings have no heartbeat")
	fs.DurationVar(&o.LeaseTolerance, "heartbeat-lease-tolerance", 0, "how long after its last renewal a kbind v2 konnector's Lease still makes its binding healthy; 0: twice the Lease's leaseDurationSeconds plus 30s (2m30s with the released konnector, which renews every 30s)")
}

// Validate checks the options.
func (o Options) Validate() []error {
	if o.LeaseTolerance < 0 {
		return []error{fmt.Errorf("--heartbeat-lease-tolerance %s: must be 0 (from the Lease) or positive", o.LeaseTolerance)}
	}
	return nil
}
