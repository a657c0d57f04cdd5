package main

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// kubectl's cluster flags reach the consumer cluster's client config.
func TestClusterFlags(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {server: "https://a.example:6443"}
- name: b
  cluster: {server: "https://b.example:6443"}
users:
- name: u
  user: {token: from-file}
contexts:
- name: ctx-a
  context: {cluster: a, user: u}
- name: ctx-b
  context: {cluster: b, user: u}
current-context: ctx-a
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not read here"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := &options{streams: ioStreams{Out: io.Discard, ErrOut: io.Discard}}
	fs := pflag.NewFlagSet("kube-bind-poll", pflag.ContinueOnError)
	o.addClusterFlags(fs)
	if err := fs.Parse([]string{
		"--kubeconfig", kubeconfig, "--context", "ctx-b", "--token", "from-flag",
		"--as", "alice", "--as-group", "g1", "--as-group", "g2", "--as-uid", "42", "--as-user-extra", "k=v1", "--as-user-extra", "k=v2",
		"--certificate-authority", ca, "--tls-server-name", "api.b.example", "--request-timeout", "7s", "-n", "kube-bind",
	}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://b.example:6443" || cfg.BearerToken != "from-flag" || cfg.TLSClientConfig.CAFile != ca ||
		cfg.TLSClientConfig.ServerName != "api.b.example" || cfg.Timeout != 7*time.Second {
		t.Errorf("host %q token %q CA %q server name %q timeout %s", cfg.Host, cfg.BearerToken, cfg.TLSClientConfig.CAFile,
			cfg.TLSClientConfig.ServerName, cfg.Timeout)
	}
	imp := cfg.Impersonate
	if imp.UserName != "alice" || imp.UID != "42" || !reflect.DeepEqual(imp.Groups, []string{"g1", "g2"}) ||
		!reflect.DeepEqual(imp.Extra, map[string][]string{"k": {"v1", "v2"}}) {
		t.Errorf("impersonation %+v", imp)
	}
}
