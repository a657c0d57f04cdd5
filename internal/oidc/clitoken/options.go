package clitoken

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Options are the flags of the CLI tokens.
type Options struct {
	// TTL is the life of an issued token (ValidateTTL).
	TTL time.Duration
	// NotBefore (set by Complete): tokens issued before it are refused
	// (zero: none).
	NotBefore time.Time

	notBefore string
}

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.TTL, "cli-token-ttl", DefaultTTL, "lifetime of the tokens kubectl bind login receives (15m to 24h); the CLI stops using one 5 minutes before it ends")
	fs.StringVar(&o.notBefore, "cli-tokens-not-before", "", "RFC 3339 time: CLI tokens issued before it are refused (raise it to revoke every token at once)")
}

// Complete checks the flags and reads the time.
func (o *Options) Complete() error {
	var errs []error
	if err := ValidateTTL(o.TTL); err != nil {
		errs = append(errs, fmt.Errorf("--cli-token-ttl: %v", err))
	}
	o.NotBefore = time.Time{}
	if o.notBefore != "" {
		t, err := time.Parse(time.RFC3339, o.notBefore)
		if err != nil {
			errs = append(errs, fmt.Errorf("--cli-tokens-not-before %q: want an RFC 3339 time such as 2026-11-26T10:00:00Z", o.notBefore))
		}
		o.NotBefore = t
	}
	return errors.Join(errs...)
}
