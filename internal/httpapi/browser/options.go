package browser

import (
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// Cookie key lengths New accepts: signing keys authenticate with
// HMAC-SHA256, encryption keys are AES-128, -192 or -256 keys.
var (
	SigningKeyLengths    = []int{32, 64}
	EncryptionKeyLengths = []int{16, 24, 32}
)

// Options are the browser handler's flags: the cookie keys and the
// callback flow.
type Options struct {
	// Set by Complete: the keys, the current one first (one made up for
	// this process where none is configured; KeysGenerated names their
	// flags), the allow-list's entries, and whether the callback flow is
	// off.
	SigningKeys, EncryptionKeys [][]byte
	KeysGenerated               []string
	CallbackAllowList           []string
	NoCallbackFlow              bool

	signingKey, signingKeyFile       string
	encryptionKey, encryptionKeyFile string
	callbackFlow                     bool
	callbackAllowedURLs              string
}

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	s := fs.StringVar
	s(&o.signingKey, "cookie-signing-key", "", "base64 key (32 or 64 bytes) signing cookies and login state; all replicas need the same; several keys (whitespace-separated): the first is current, the others are still accepted, a rotation (default: random per process)")
	s(&o.signingKeyFile, "cookie-signing-key-file", "", "file holding base64 cookie signing keys, one per line: the first is current, the others (a previous key during a rotation) are still accepted")
	s(&o.encryptionKey, "cookie-encryption-key", "", "base64 key (16, 24 or 32 bytes) encrypting cookies; all replicas need the same; several keys (whitespace-separated): the first is current, the others are still accepted, a rotation (default: random per process)")
	s(&o.encryptionKeyFile, "cookie-encryption-key-file", "", "file holding base64 cookie encryption keys, one per line: the first is current, the others (a previous key during a rotation) are still accepted")
	fs.BoolVar(&o.callbackFlow, "callback-flow", true, "offer the callback flow (OAuth2CodeGrant) of released kubectl bind CLIs besides the poll flow; false: discovery offers the poll flow only and /authorize refuses callback links")
	s(&o.callbackAllowedURLs, "callback-allowed-urls", "", "comma-separated callback URLs (scheme://host[:port][/path], each matched exactly: no path below it, no query) the callback flow may redirect to, besides http URLs on a loopback host; not with --callback-flow=false")
}

// Complete reads and checks the flags the way New checks its Config.
func (o *Options) Complete() error {
	var errs []error
	o.KeysGenerated = nil
	for _, k := range []struct {
		flag        string
		value, file string
		lengths     []int
		keys        *[][]byte
	}{
		{"cookie-signing-key", o.signingKey, o.signingKeyFile, SigningKeyLengths, &o.SigningKeys},
		{"cookie-encryption-key", o.encryptionKey, o.encryptionKeyFile, EncryptionKeyLengths, &o.EncryptionKeys},
	} {
		keys, err := flagvalue.Keys(k.flag, k.value, k.file, k.lengths...)
		switch {
		case err != nil:
			errs = append(errs, err)
		case keys == nil:
			keys = [][]byte{flagvalue.RandomKey(32)}
			o.KeysGenerated = append(o.KeysGenerated, k.flag)
		}
		*k.keys = keys
	}
	o.CallbackAllowList = flagvalue.List(o.callbackAllowedURLs)
	_, listErrs := ParseCallbackAllowList(o.CallbackAllowList)
	for _, err := range listErrs {
		errs = append(errs, fmt.Errorf("--callback-allowed-urls: %w", err))
	}
	o.NoCallbackFlow = !o.callbackFlow
	if o.NoCallbackFlow && len(o.CallbackAllowList) > 0 {
		errs = append(errs, errors.New("--callback-allowed-urls with --callback-flow=false: the allow-list is for the callback flow; drop one"))
	}
	return errors.Join(errs...)
}

// checkKeys checks each key's length (New's check of keys that did not
// come through Complete).
func checkKeys(what string, keys [][]byte, lengths []int) error {
	for i, k := range keys {
		if !slices.Contains(lengths, len(k)) {
			return fmt.Errorf("browser: %s %d has %d bytes, want %s", what, i+1, len(k), flagvalue.JoinInts(lengths))
		}
	}
	return nil
}
