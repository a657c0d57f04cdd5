// Package oidcprovider starts a real OpenID Connect provider for tests: npm's
// oidc-provider, run by Node.js from test/oidcprovider, with one confidential
// client, PKCE required, and test users whose passwords are checked.
package oidcprovider

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// User is a test user the provider knows. Its subject (sub) is its Name.
type User struct {
	Name     string   `json:"name"`
	Password string   `json:"password"`
	Email    string   `json:"email,omitempty"`
	Groups   []string `json:"groups,omitempty"`
}

// Options configure the provider of one test.
type Options struct {
	// RedirectURIs of the client; the login helper stops at a redirect to any of them.
	RedirectURIs []string
	Users        []User
}

// Provider is a running provider.
type Provider struct {
	IssuerURL    string
	ClientID     string
	ClientSecret string

	redirectURIs []string
}

const startTimeout = 60 * time.Second

// Dir is the folder holding server.js and its package.json.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "test", "oidcprovider")
}

// Start starts a provider for the test and stops it when the test ends. It
// fails the test (in CI and elsewhere) when Node.js or the npm packages are
// missing, naming the script that installs them.
func Start(t testing.TB, opts Options) *Provider {
	t.Helper()
	if len(opts.RedirectURIs) == 0 {
		t.Fatal("oidcprovider: Options.RedirectURIs is empty")
	}
	dir := Dir()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "oidc-provider")); err != nil {
		t.Fatalf("oidcprovider: %s/node_modules is missing: run hack/install-test-deps.sh", dir)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("oidcprovider: node not found on PATH (Node.js 20 or later is needed; see hack/install-test-deps.sh): %v", err)
	}

	p := &Provider{
		ClientID:     "kube-bind-backend-test",
		ClientSecret: randomString(t),
		redirectURIs: append([]string(nil), opts.RedirectURIs...),
	}
	users := opts.Users
	if users == nil {
		users = []User{}
	}
	cfg, err := json.Marshal(map[string]any{
		"host":         "127.0.0.1",
		"port":         0,
		"clientID":     p.ClientID,
		"clientSecret": p.ClientSecret,
		"redirectURIs": opts.RedirectURIs,
		"users":        users,
	})
	if err != nil {
		t.Fatalf("oidcprovider: %v", err)
	}

	logs := &syncBuffer{}
	cmd := exec.Command(node, filepath.Join(dir, "server.js"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OIDC_PROVIDER_CONFIG="+string(cfg))
	cmd.Stderr = logs
	setProcAttr(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("oidcprovider: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("oidcprovider: starting node: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("oidcprovider logs:\n%s", logs.String())
		}
	})

	// The first stdout line names the issuer; the rest is kept as logs.
	issuer := make(chan string, 1)
	go func() {
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
			logs.Write(append(sc.Bytes(), '\n'))
		}
	}()

	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	select {
	case p.IssuerURL = <-issuer:
	case <-exited:
		t.Fatalf("oidcprovider: node exited before serving:\n%s", logs.String())
	case <-deadline.C:
		t.Fatalf("oidcprovider: not serving after %s:\n%s", startTimeout, logs.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitForDiscovery(ctx, p.IssuerURL); err != nil {
		t.Fatalf("oidcprovider: %v\n%s", err, logs.String())
	}
	return p
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

func randomString(t testing.TB) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("oidcprovider: %v", err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
