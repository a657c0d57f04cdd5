package clitoken

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Options are the flags of the CLI tokens.
type Options struct {
	// TTL is the life of an issued token (ValidateTTL).
	TTL time.Duration
	// NotBefore (set by Complete): tokens issued before it are refused
	// (zero: none).
	NotBefore time.Time
	// RevocationsNamespace and RevocationsName (set by Complete) name the
	// ConfigMap of per-user revocations (internal/oidc/clitoken/revocations);
	// empty: none is read.
	RevocationsNamespace, RevocationsName string
	// RequestRate is how many requests with a token one user (subject)
	// may make per second, with a burst of three seconds' worth; BindRate
	// is how many of them may be POST /api/bind per minute, with a burst
	// of BindBurst. 0: no limit.
	RequestRate float64
	BindRate    float64

	notBefore, revocations string
}

// BindBurst is the burst of --cli-token-bind-rate: binding a few
// templates at once is not slowed down.
const BindBurst = 10

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.TTL, "cli-token-ttl", DefaultTTL, "lifetime of the tokens kubectl bind login receives (15m to 24h); the CLI stops using one 5 minutes before it ends")
	fs.StringVar(&o.notBefore, "cli-tokens-not-before", "", "RFC 3339 time: CLI tokens issued before it are refused (raise it to revoke every token at once)")
	fs.StringVar(&o.revocations, "cli-token-revocations", "", "<namespace>/<name> of a ConfigMap whose entries \"<RFC 3339 time> <subject>\" revoke one user's CLI tokens issued before that time (every replica watches it; docs/v1alpha2.md); empty: none")
	fs.Float64Var(&o.RequestRate, "cli-token-request-rate", 5, "requests with a CLI token (/api/templates, /api/collections, /api/bind) one user may make per second, with a burst of three seconds' worth; more are answered 429 (0: no limit)")
	fs.Float64Var(&o.BindRate, "cli-token-bind-rate", 20, fmt.Sprintf("POST /api/bind requests one user may make per minute, with a burst of %d; more are answered 429 (0: no limit)", BindBurst))
}

// Complete checks the flags and reads the time.
func (o *Options) Complete() error {
	var errs []error
	if err := ValidateTTL(o.TTL); err != nil {
		errs = append(errs, fmt.Errorf("--cli-token-ttl: %w", err))
	}
	o.NotBefore = time.Time{}
	if o.notBefore != "" {
		t, err := time.Parse(time.RFC3339, o.notBefore)
		if err != nil {
			errs = append(errs, fmt.Errorf("--cli-tokens-not-before %q: want an RFC 3339 time such as 2026-11-26T10:00:00Z", o.notBefore))
		}
		o.NotBefore = t
	}
	o.RevocationsNamespace, o.RevocationsName = "", ""
	if o.revocations != "" {
		ns, name, ok := strings.Cut(o.revocations, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			errs = append(errs, fmt.Errorf("--cli-token-revocations %q: want <namespace>/<name> of a ConfigMap", o.revocations))
		} else {
			o.RevocationsNamespace, o.RevocationsName = ns, name
		}
	}
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--cli-token-request-rate", o.RequestRate}, {"--cli-token-bind-rate", o.BindRate}} {
		if !(r.v >= 0) || math.IsInf(r.v, 0) {
			errs = append(errs, fmt.Errorf("%s %v: must be 0 (no limit) or positive", r.flag, r.v))
		}
	}
	return errors.Join(errs...)
}
