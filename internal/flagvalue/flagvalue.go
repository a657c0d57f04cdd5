// Package flagvalue reads flag values the way every component of the
// backend reads them: a secret given as a value or as a file, base64 key
// lists (a rotation: the current key first), comma-separated lists and
// absolute http(s) URLs. Errors name the flag they are given.
package flagvalue

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// ValueOrFile returns the value of --name or the trimmed content of
// --name-file; giving both is an error.
func ValueOrFile(name, value, file string) (string, error) {
	if value != "" && file != "" {
		return "", fmt.Errorf("--%s and --%s-file: give only one", name, name)
	}
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s-file: %w", name, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("--%s-file %s is empty", name, file)
	}
	return v, nil
}

// Keys decodes the keys of --name (or --name-file): base64 keys (standard
// or URL alphabet, padded or not) separated by white space, one per line
// in a file, each of one of the given lengths. The first is the current
// key, the others are previous ones (a rotation). nil when none is
// configured. Errors name the key's position when there are several,
// never its value.
func Keys(name, value, file string, lengths ...int) ([][]byte, error) {
	v, err := ValueOrFile(name, value, file)
	if err != nil || v == "" {
		return nil, err
	}
	fields := strings.Fields(v)
	var keys [][]byte
	var errs []error
	for i, f := range fields {
		which, notBase64 := "", "not base64"
		if len(fields) > 1 {
			which = fmt.Sprintf("key %d ", i+1)
			notBase64 = which + "is not base64"
		}
		key, ok := DecodeBase64(f)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("--%s: %s; make one with: openssl rand -base64 32", name, notBase64))
		case !slices.Contains(lengths, len(key)):
			errs = append(errs, fmt.Errorf("--%s: %sdecodes to %d bytes, want %s", name, which, len(key), JoinInts(lengths)))
		default:
			keys = append(keys, key)
		}
	}
	if len(errs) > 0 {
		// openssl rand -base64 64 breaks its output over two lines.
		if whole, ok := DecodeBase64(strings.Join(fields, "")); len(fields) > 1 && ok && slices.Contains(lengths, len(whole)) {
			errs = append(errs, fmt.Errorf("--%s: one key per line; is a key broken over several lines? Make one with: openssl rand -base64 %d | tr -d '\\n'", name, len(whole)))
		}
		return nil, errors.Join(errs...)
	}
	return keys, nil
}

// DecodeBase64 decodes standard or URL base64, padded or not.
func DecodeBase64(s string) ([]byte, bool) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, true
		}
	}
	return nil, false
}

// RandomKey returns n random bytes: the key of a process that was given
// none.
func RandomKey(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// List splits a comma-separated list, dropping blanks around and empty
// entries.
func List(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// HTTPURL parses an absolute http:// or https:// URL without user
// information.
func HTTPURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("must be an absolute http:// or https:// URL")
	}
	if u.User != nil {
		return nil, errors.New("must not carry user information")
	}
	return u, nil
}

// JoinInts lists allowed lengths: "32 or 48 or 64".
func JoinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, " or ")
}

// Parse parses args into the flags add registers: one component's flags
// on their own, as its tests give them.
func Parse(args []string, add func(*pflag.FlagSet)) error {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	add(fs)
	return fs.Parse(args)
}

// Options are one component's flags: AddFlags registers them, Complete
// checks them and fills in what they set.
type Options interface {
	AddFlags(*pflag.FlagSet)
	Complete() error
}

// ParseAndComplete parses args into o's flags alone and completes them:
// a component's flag path on its own, as its tests take it.
func ParseAndComplete(o Options, args ...string) error {
	if err := Parse(args, o.AddFlags); err != nil {
		return err
	}
	return o.Complete()
}

// ParseNew is ParseAndComplete on fresh options of type T.
func ParseNew[T any, P interface {
	*T
	Options
}](args ...string) (*T, error) {
	o := new(T)
	return o, ParseAndComplete(P(o), args...)
}
