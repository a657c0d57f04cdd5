package heartbeats

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Options are the operator's health flags.
type Options struct {
	// LeaseTolerance is Config.LeaseTolerance.
	LeaseTolerance time.Duration
}

// AddFlags registers the flags, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.LeaseTolerance, "heartbeat-lease-tolerance", 0, "how long after its last renewal a kbind v2 konnector's Lease still makes its binding healthy; 0: twice the Lease's leaseDurationSeconds plus 30s (2m30s with the released konnector, which renews every 30s)")
}

// Validate checks the options.
func (o Options) Validate() []error {
	if o.LeaseTolerance < 0 {
		return []error{fmt.Errorf("--heartbeat-lease-tolerance %s: must be 0 (from the Lease) or positive", o.LeaseTolerance)}
	}
	return nil
}
