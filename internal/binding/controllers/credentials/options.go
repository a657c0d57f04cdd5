package credentials

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/binding"
)

// AddFlags registers the flags of the policy, with the defaults; Validate
// checks them.
func (p *Policy) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&p.Lifetime, "credential-lifetime", binding.DefaultTokenLifetime, "lifetime of each consumer token (TokenRequest); at least 10m, the API server's minimum, which may also cap it")
	fs.Float64Var(&p.RotationPoint, "credential-rotation-point", 0.8, "fraction of a token's lifetime after which it is replaced by a new one (0 < x < 1)")
	fs.DurationVar(&p.Overlap, "credential-overlap", 10*time.Minute, "how long after a rotation the konnector must have sent a heartbeat before the replaced token is revoked (cover a few konnector resyncs)")
	fs.DurationVar(&p.BindingLifetime, "binding-lifetime", 30*24*time.Hour, "how long after the user's last bind every token of the binding is revoked and the user must bind again (a stolen token follows the rotations until then); at least 2 credential lifetimes; 0: never (a thief keeps access as long as the binding lives)")
}
