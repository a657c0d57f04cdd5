package clusterkey

import (
	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// Options are the flags of the cluster secret key.
type Options struct {
	// Keys are the keys, the current one first (set by Complete): the
	// configured ones, else one made up for this process.
	Keys [][]byte
	// Generated says Keys were made up: the secrets issued now stop
	// proving their cluster IDs on restart.
	Generated bool

	key, keyFile string
}

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.key, "cluster-secret-key", "", "base64 key (32, 48 or 64 bytes) from which cluster secrets are derived; all replicas need the same, and it must survive restarts and upgrades; several keys (whitespace-separated): the first issues secrets, all prove them, a rotation (default: random per process)")
	fs.StringVar(&o.keyFile, "cluster-secret-key-file", "", "file holding base64 cluster secret keys, one per line: the first issues cluster secrets, the others (previous keys during a rotation) still prove theirs")
}

// Complete reads and checks the keys (each of KeyLengths), or makes one
// up when none is configured.
func (o *Options) Complete() error {
	keys, err := flagvalue.Keys("cluster-secret-key", o.key, o.keyFile, KeyLengths...)
	if err != nil {
		return err
	}
	if keys == nil {
		keys, o.Generated = [][]byte{flagvalue.RandomKey(MinKeyLen)}, true
	}
	o.Keys = keys
	return nil
}
