package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kbprovider/backend/internal/binding"
)

// credentialsFlags are the flags of consumer credentials: how long an
// issued token lives, when it is rotated, and how long a replaced token
// stays valid for the konnector to switch (internal/credentials).
type credentialsFlags struct {
	lifetime      time.Duration
	rotationPoint float64
	overlap       time.Duration
}

// credentialsConfig is their validated form.
type credentialsConfig struct {
	Lifetime      time.Duration
	RotationPoint float64
	Overlap       time.Duration
}

func (f *credentialsFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.lifetime, "credential-lifetime", binding.DefaultTokenLifetime, "lifetime of each consumer token (TokenRequest); at least 10m, the API server's minimum, which may also cap it")
	fs.Float64Var(&f.rotationPoint, "credential-rotation-point", 0.8, "fraction of a token's lifetime after which it is replaced by a new one (0 < x < 1)")
	fs.DurationVar(&f.overlap, "credential-overlap", 10*time.Minute, "how long after a rotation the konnector must have sent a heartbeat before the replaced token is revoked (cover a few konnector resyncs)")
}

func (f *credentialsFlags) validate() (credentialsConfig, []error) {
	var errs []error
	if f.lifetime < binding.MinTokenLifetime {
		errs = append(errs, fmt.Errorf("--credential-lifetime %s: must be at least %s (the API server's minimum)", f.lifetime, binding.MinTokenLifetime))
	}
	if !(f.rotationPoint > 0 && f.rotationPoint < 1) {
		errs = append(errs, fmt.Errorf("--credential-rotation-point %g: want a fraction between 0 and 1, e.g. 0.8", f.rotationPoint))
	}
	if f.overlap <= 0 {
		errs = append(errs, fmt.Errorf("--credential-overlap %s: must be positive", f.overlap))
	}
	if len(errs) == 0 {
		if rest := (f.lifetime - time.Duration(float64(f.lifetime)*f.rotationPoint)).Round(time.Second); f.overlap >= rest {
			errs = append(errs, fmt.Errorf("--credential-overlap %s: must be shorter than what remains of a token after its rotation (%s with --credential-lifetime %s and --credential-rotation-point %g), or the konnector has no time to switch",
				f.overlap, rest, f.lifetime, f.rotationPoint))
		}
	}
	return credentialsConfig{Lifetime: f.lifetime, RotationPoint: f.rotationPoint, Overlap: f.overlap}, errs
}
