package main

import (
	"flag"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/credentials"
)

// credentialsFlags are the flags of consumer credentials: how long an
// issued token lives, when it is rotated, and how long a replaced token
// stays valid for the konnector to switch (internal/credentials).
type credentialsFlags struct {
	lifetime      time.Duration
	rotationPoint float64
	overlap       time.Duration
	binding       time.Duration
}

func (f *credentialsFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.lifetime, "credential-lifetime", binding.DefaultTokenLifetime, "lifetime of each consumer token (TokenRequest); at least 10m, the API server's minimum, which may also cap it")
	fs.Float64Var(&f.rotationPoint, "credential-rotation-point", 0.8, "fraction of a token's lifetime after which it is replaced by a new one (0 < x < 1)")
	fs.DurationVar(&f.overlap, "credential-overlap", 10*time.Minute, "how long after a rotation the konnector must have sent a heartbeat before the replaced token is revoked (cover a few konnector resyncs)")
	fs.DurationVar(&f.binding, "binding-lifetime", 30*24*time.Hour, "how long after the user's last bind every token of the binding is revoked and the user must bind again (a stolen token follows the rotations until then); at least 2 credential lifetimes; 0: never (a thief keeps access as long as the binding lives)")
}

// validate hands the values to their owner's check (credentials.Policy).
func (f *credentialsFlags) validate() (credentials.Policy, []error) {
	p := credentials.Policy{Lifetime: f.lifetime, RotationPoint: f.rotationPoint, Overlap: f.overlap, BindingLifetime: f.binding}
	return p, p.Validate()
}
