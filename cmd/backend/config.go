package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kbprovider/backend/internal/server"
)

// envPrefix: every flag --some-name can also be given as the environment
// variable KUBE_BIND_SOME_NAME (upper case, dashes become underscores). A
// flag on the command line wins over the environment, which wins over the
// default.
const envPrefix = "KUBE_BIND_"

// envName returns the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// noEnv lists flags that have no environment variable.
var noEnv = map[string]bool{"version": true, "help": true}

// config is the backend's validated configuration: what internal/server
// is built from, and what only this command uses.
type config struct {
	server.Config

	LogLevel  slog.Level
	LogFormat string // "json" or "text"

	ShowVersion bool

	// MemoryLimit is the container's memory limit in bytes (0: none); the
	// Go runtime's soft limit is set below it (memoryLimitShare).
	MemoryLimit int64
}

// flags are the options of every component (server.Options) and this
// command's own, as given.
type flags struct {
	server                           server.Options
	logLevel, logFormat, memoryLimit string
	version                          bool
}

func newFlagSet(out io.Writer) (*pflag.FlagSet, *flags) {
	f := &flags{}
	fs := pflag.NewFlagSet("kube-bind-backend", pflag.ContinueOnError)
	fs.SetOutput(out)
	f.server.AddFlags(fs)
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&f.memoryLimit, "memory-limit", "", "the container's memory limit, a byte count or quantity (256Mi); the Go runtime keeps its heap under 85% of it unless GOMEMLIMIT is set. The chart sets it from the container's limit")
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kube-bind-backend [flags]\n\nEvery flag --some-name can also be set as environment variable %sSOME_NAME;\nthe command line wins over the environment.\n\nFlags:\n", envPrefix)
		fs.PrintDefaults()
	}
	return fs, f
}

// parseConfig reads flags from args and, for flags not on the command line,
// from the environment via getenv; then it validates the result. Errors
// name the flag (and the environment variable, where it came from there).
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (*config, error) {
	fs, f := newFlagSet(usage)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: all settings are flags", fs.Args())
	}
	if err := setFromEnvironment(fs, getenv); err != nil {
		return nil, err
	}
	if f.version {
		return &config{ShowVersion: true}, nil
	}
	f.server.PodIP, f.server.PodNamespace, f.server.PodName = getenv("POD_IP"), getenv("POD_NAMESPACE"), getenv("POD_NAME")
	return f.complete()
}

// setFromEnvironment sets each flag not on the command line from its
// environment variable, if that is set.
func setFromEnvironment(fs *pflag.FlagSet, getenv func(string) string) error {
	var unset []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Changed && !noEnv[f.Name] {
			unset = append(unset, f)
		}
	})
	for _, f := range unset {
		name := envName(f.Name)
		if v := getenv(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				return fmt.Errorf("invalid value %q for %s (--%s): %s", redactIfSecret(f.Name, v), name, f.Name, want(f, err))
			}
		}
	}
	return nil
}

func redactIfSecret(flagName, v string) string {
	if strings.Contains(flagName, "secret") || strings.Contains(flagName, "key") && !strings.HasSuffix(flagName, "-file") {
		return "<redacted>"
	}
	return v
}

// want says what a flag's value should look like.
func want(f *pflag.Flag, err error) string {
	switch f.Value.Type() {
	case "duration":
		return "want a duration such as 30s, 2m or 1h30m"
	case "int":
		return "want a whole number"
	case "bool":
		return "want true or false"
	}
	if cause := errors.Unwrap(err); cause != nil {
		return cause.Error()
	}
	return err.Error()
}

// complete completes every component's options and checks this
// command's own flags.
func (f *flags) complete() (*config, error) {
	errs := []error{f.server.Complete()}
	c := &config{Config: f.server.Config}
	if err := c.LogLevel.UnmarshalText([]byte(f.logLevel)); err != nil || !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(f.logLevel)) {
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel))
	}
	c.LogFormat = strings.ToLower(f.logFormat)
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("--log-format %q: want json or text", f.logFormat))
	}
	if f.memoryLimit != "" {
		q, err := resource.ParseQuantity(f.memoryLimit)
		if err != nil || q.Value() < 32<<20 {
			errs = append(errs, fmt.Errorf("--memory-limit %q: must be a quantity of at least 32Mi, e.g. 256Mi", f.memoryLimit))
		} else {
			c.MemoryLimit = q.Value()
		}
	}
	return c, errors.Join(errs...)
}
