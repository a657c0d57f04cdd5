package server

import (
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestOptionsDefaults(t *testing.T) {
	o, err := flagvalue.ParseNew[Options]()
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.ListenAddress != ":8080" || c.DiagnosticsAddress != "127.0.0.1:9090" || c.ExternalURL != nil || c.PrettyName != "kube-bind provider" ||
		c.SessionTTL != 10*time.Minute || c.PollInterval != 2*time.Second || c.GracePeriod != time.Minute || c.MaxPolledSessions != 100000 ||
		c.MaxConnections != 4096 || c.MaxConnsPerClient != 64 || c.SessionCreateRate != 10 || c.ShutdownTimeout != 25*time.Second ||
		c.Store.Kind != StoreMemory || c.Store.PeerKeys != nil || len(c.Browser.CallbackAllowList) != 0 {
		t.Errorf("defaults: %+v", c)
	}
}

func TestInvalidOptions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--external-url", "bind.example.com"}, `--external-url "bind.example.com": must be an absolute http:// or https:// URL`},
		{[]string{"--external-url", "ftp://x"}, "--external-url"},
		{[]string{"--external-url", "https://x/?q=1"}, "must not have a query"},
		{[]string{"--external-url", "::"}, "--external-url"},
		{[]string{"--listen-address", "8080"}, "--listen-address"},
		{[]string{"--diagnostics-address", "9090"}, `--diagnostics-address "9090": want host:port`},
		{[]string{"--listen-address", ":9000", "--diagnostics-address", "127.0.0.1:9000"}, "needs a port of its own"},
		{[]string{"--poll-interval", "0s"}, "--poll-interval 0s: must be positive"},
		{[]string{"--poll-interval", "20m"}, "must be shorter than --session-ttl"},
		{[]string{"--session-ttl", "0s"}, "--session-ttl 0s: must be positive"},
		{[]string{"--grace-period", "-1s"}, "--grace-period"},
		{[]string{"--max-polled-sessions", "0"}, "--max-polled-sessions"},
		{[]string{"--max-polled-sessions", "10000001"}, "at most 10000000"},
		{[]string{"--max-connections", "-1"}, "--max-connections -1"},
		{[]string{"--max-connections-per-client", "-1"}, "--max-connections-per-client -1"},
		{[]string{"--session-create-rate", "-1"}, "--session-create-rate -1"},
		{[]string{"--shutdown-timeout", "0s"}, "--shutdown-timeout 0s"},
		{[]string{"--tls-cert-file", "/x"}, "go together"},
		{[]string{"--tls-cert-file", "/x", "--tls-key-file", "/y"}, "TLS: "},
		{[]string{"--pretty-name", " "}, "--pretty-name"},
		// Each component's flags are checked by the component.
		{[]string{"--cookie-encryption-key", "!!!notbase64"}, "--cookie-encryption-key: not base64"},
		{[]string{"--consumer-scope", "Everything"}, "want Namespaced or Cluster"},
		{[]string{"--long-poll-max-wait", "2m"}, "--long-poll-max-wait 2m0s"},
		{[]string{"--cli-token-ttl=14m59s"}, "--cli-token-ttl"},
		{[]string{"--credential-overlap", "0s"}, "--credential-overlap 0s: must be positive"},
		{[]string{"--oidc-issuer-url", "https://idp"}, "--oidc-issuer-client-id is required"},
		{[]string{"--cluster-secret-key", "!!!"}, "--cluster-secret-key"},
		// The garbage collection must outlive a session.
		{[]string{"--gc-unused-binding-after=90m", "--session-ttl=2h"}, "must be longer than the session TTL 2h0m0s"},
	} {
		if _, err := flagvalue.ParseNew[Options](c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// The pod's namespace and name the environment gives reach the Lease.
func TestOptionsPodToLeader(t *testing.T) {
	o := &Options{PodNamespace: "ns", PodName: "kbb-0"}
	if err := flagvalue.ParseAndComplete(o); err != nil {
		t.Fatal(err)
	}
	if l := o.Controllers.Leader; !l.Enabled || l.Namespace != "ns" || l.PodName != "kbb-0" {
		t.Errorf("leader %+v", l)
	}
}
