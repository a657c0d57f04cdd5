// Package oidcprovider starts a real OpenID Connect provider for the local
// demo and the tests (testing.go): npm's oidc-provider, run by Node.js
// from test/oidcprovider, with one confidential client, PKCE required, and
// test users whose passwords are checked.
package oidcprovider

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// User is a test user the provider knows. Its subject (sub) is its Name.
type User struct {
	Name     string   `json:"name"`
	Password string   `json:"password"`
	Email    string   `json:"email,omitempty"`
	Groups   []string `json:"groups,omitempty"`
	// EmailVerified is the ID token's email_verified claim as raw JSON
	// (e.g. `"true"`, `1`, `null`), for testing what a relying party
	// trusts; nil: true when Email is set. NoEmailVerified leaves the
	// claim out.
	EmailVerified   json.RawMessage `json:"emailVerified,omitempty"`
	NoEmailVerified bool            `json:"noEmailVerified,omitempty"`
}

// Options configure the provider of one test (or of the local demo).
type Options struct {
	// RedirectURIs of the client; the login helper stops at a redirect to any of them.
	RedirectURIs []string
	Users        []User
	// Address is the host:port to listen on; "" picks a free loopback port.
	Address string
	// ClientID of the static client; "" is "kube-bind-backend-test".
	ClientID string
	// ClientSecret of the client; "" makes a random one.
	ClientSecret string
	// Log receives the provider's output; nil keeps it in memory (Logs).
	Log io.Writer
}

// Provider is a running provider.
type Provider struct {
	IssuerURL    string
	ClientID     string
	ClientSecret string

	redirectURIs []string
	cmd          *exec.Cmd     // nil for Attach
	exited       chan struct{} // closed when node has exited
	logs         *procs.Buffer
}

// Dir is the folder holding server.js and its package.json.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "test", "oidcprovider")
}

// A start gets attemptTimeout, and a failed one is made again once: now
// and then Node.js prints its runtime warning and then nothing ("not
// serving"), cause not found; the provider it runs is the same each
// time, so a second start is worth its time.
const (
	attemptTimeout = 40 * time.Second
	startAttempts  = 2
)

// RunRetrying is Run with each start bounded by attemptTimeout and a
// failed one made again once; retried, if set, is told of each failed
// attempt that is made again.
func RunRetrying(ctx context.Context, opts Options, retried func(attempt int, err error)) (*Provider, error) {
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		p, err := Run(actx, opts)
		cancel()
		if err == nil || attempt == startAttempts || ctx.Err() != nil {
			return p, err
		}
		if retried != nil {
			retried(attempt, err)
		}
	}
}

// Run starts a provider; the caller must call Stop. It returns once discovery answers, or fails when Node.js or
// the npm packages are missing, naming the script that installs them.
func Run(ctx context.Context, opts Options) (_ *Provider, err error) {
	if err := procs.RefuseInParallelSet("the OpenID Connect provider"); err != nil {
		return nil, err
	}
	if len(opts.RedirectURIs) == 0 {
		return nil, errors.New("Options.RedirectURIs is empty")
	}
	host, port := "127.0.0.1", 0
	if opts.Address != "" {
		h, ps, err := net.SplitHostPort(opts.Address)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", opts.Address, err)
		}
		if port, err = strconv.Atoi(ps); err != nil || port < 0 || port > 65535 {
			return nil, fmt.Errorf("address %q: bad port", opts.Address)
		}
		if h != "" {
			host = h
		}
	}
	dir := Dir()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "oidc-provider")); err != nil {
		return nil, fmt.Errorf("%s/node_modules is missing: run hack/install-test-deps.sh", dir)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("node not found on PATH (Node.js 20 or later is needed; see hack/install-test-deps.sh): %w", err)
	}

	p := &Provider{
		ClientID:     opts.ClientID,
		ClientSecret: opts.ClientSecret,
		redirectURIs: append([]string(nil), opts.RedirectURIs...),
		exited:       make(chan struct{}),
	}
	if p.ClientID == "" {
		p.ClientID = "kube-bind-backend-test"
	}
	if p.ClientSecret == "" {
		if p.ClientSecret, err = randomString(); err != nil {
			return nil, err
		}
	}
	users := opts.Users
	if users == nil {
		users = []User{}
	}
	cfg, err := json.Marshal(map[string]any{
		"host":         host,
		"port":         port,
		"clientID":     p.ClientID,
		"clientSecret": p.ClientSecret,
		"redirectURIs": opts.RedirectURIs,
		"users":        users,
	})
	if err != nil {
		return nil, err
	}

	logs := opts.Log
	if logs == nil {
		p.logs = &procs.Buffer{}
		logs = p.logs
	}
	cmd := exec.Command(node, filepath.Join(dir, "server.js"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OIDC_PROVIDER_CONFIG="+string(cfg))
	cmd.Stderr = logs
	setProcAttr(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node: %w", err)
	}
	p.cmd = cmd
	// The first stdout line names the issuer; the rest is kept as logs.
	issuer := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stdout)
		first := true
		for sc.Scan() {
			if first {
				first = false
				var ready struct {
					Issuer string `json:"issuer"`
				}
				if json.Unmarshal(sc.Bytes(), &ready) == nil && ready.Issuer != "" {
					issuer <- ready.Issuer
					continue
				}
			}
			_, _ = logs.Write(append(sc.Bytes(), '\n'))
		}
	}()
	go func() {
		<-copied // Wait closes stdout: read it all first
		_ = cmd.Wait()
		close(p.exited)
	}()
	defer func() {
		if err != nil {
			p.Stop()
			if p.logs != nil {
				err = fmt.Errorf("%w\n%s", err, p.Logs())
			}
		}
	}()

	select {
	case p.IssuerURL = <-issuer:
	case <-p.exited:
		return nil, errors.New("node exited before serving")
	case <-ctx.Done():
		return nil, fmt.Errorf("not serving: %w", ctx.Err())
	}
	if err := waitForDiscovery(ctx, p.IssuerURL); err != nil {
		return nil, err
	}
	return p, nil
}

// Attach returns a Provider for one that another process runs (such as the
// local demo's), so that Login can be used against it; Stop does nothing.
func Attach(issuerURL string, redirectURIs ...string) *Provider {
	exited := make(chan struct{})
	return &Provider{IssuerURL: issuerURL, redirectURIs: append([]string(nil), redirectURIs...), exited: exited}
}

// Stop stops the provider and waits until it has exited.
func (p *Provider) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Done is closed when the provider's process has exited (never for Attach).
func (p *Provider) Done() <-chan struct{} { return p.exited }

// Logs returns what the provider printed, unless Options.Log took it.
func (p *Provider) Logs() string {
	if p.logs == nil {
		return ""
	}
	return p.logs.String()
}

func waitForDiscovery(ctx context.Context, issuer string) error {
	u := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("discovery not answering"), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func randomString() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
