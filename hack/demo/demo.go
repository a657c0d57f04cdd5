package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kbprovider/backend/internal/testutil/controlplane"
	"github.com/kbprovider/backend/internal/testutil/exampleapis"
	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
)

const (
	readyTimeout   = 90 * time.Second
	backendStopMax = 10 * time.Second
)

// demo is one run: what it started, to stop it again in reverse order.
type demo struct {
	opts *options
	log  io.Writer

	baseURL       string
	cp            *controlplane.ControlPlane
	idp           *oidcprovider.Provider
	idpLog        *os.File
	backend       *exec.Cmd
	backendLog    *os.File
	backendExited chan error // receives the backend's exit, once
	backendDone   chan struct{}
}

func (d *demo) path(name string) string { return filepath.Join(d.opts.stateDir, name) }

func (d *demo) step(format string, args ...any) {
	fmt.Fprintf(d.log, "[demo %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (d *demo) start(ctx context.Context) error {
	o := d.opts
	d.baseURL = "http://" + o.listenAddress
	// Refuse taken ports before starting anything, naming the flag.
	for _, a := range []struct{ flag, addr string }{{"--listen-address", o.listenAddress}, {"--oidc-address", o.oidcAddress}} {
		l, err := net.Listen("tcp", a.addr)
		if err != nil {
			return fmt.Errorf("cannot listen on %s (%v): is another demo running? Choose another address with %s", a.addr, err, a.flag)
		}
		l.Close()
	}
	if o.stateDir == "" {
		dir, err := os.MkdirTemp("", "kube-bind-demo-")
		if err != nil {
			return err
		}
		o.stateDir = dir
	}
	if err := os.MkdirAll(d.path("consumer"), 0o700); err != nil {
		return err
	}

	t := time.Now()
	d.step("starting etcd, kube-apiserver and kube-controller-manager (logs: %s)", d.path("controlplane"))
	cp, err := controlplane.Start(ctx, controlplane.Options{BinDir: o.binDir, Dir: d.path("controlplane")})
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	d.cp = cp
	d.step("control plane up at %s (%s)", cp.Host(), since(t))

	t = time.Now()
	if err := exampleapis.Prepare(ctx, cp.AdminConfig(), exampleAPIs...); err != nil {
		return fmt.Errorf("installing the kube-bind CRDs and the example APIs: %w", err)
	}
	d.step("installed the kube-bind CRDs, the consumer ClusterRoles and the example APIs %s (%s)", describeAPIs(), since(t))

	t = time.Now()
	if d.idpLog, err = os.Create(d.path("oidc-provider.log")); err != nil {
		return err
	}
	secret, err := randomKey(32)
	if err != nil {
		return err
	}
	d.idp, err = oidcprovider.Run(ctx, oidcprovider.Options{
		Address:      o.oidcAddress,
		ClientID:     "kube-bind-demo",
		ClientSecret: secret,
		RedirectURIs: []string{d.baseURL + "/callback"},
		Users:        []oidcprovider.User{{Name: o.user, Password: o.password, Email: o.user + "@example.com", Groups: []string{"kube-bind-demo"}}},
		Log:          d.idpLog,
	})
	if err != nil {
		return fmt.Errorf("OpenID Connect provider (log: %s): %w", d.path("oidc-provider.log"), err)
	}
	d.step("OpenID Connect provider up at %s (%s)", d.idp.IssuerURL, since(t))

	t = time.Now()
	if err := d.startBackend(ctx, secret); err != nil {
		return fmt.Errorf("backend (log: %s): %w", d.path("backend.log"), err)
	}
	d.step("backend ready at %s (%s)", d.baseURL, since(t))
	return ctx.Err()
}

func (d *demo) startBackend(ctx context.Context, clientSecret string) error {
	o := d.opts
	signing, err := randomKey(32)
	if err != nil {
		return err
	}
	encryption, err := randomKey(32)
	if err != nil {
		return err
	}
	if d.backendLog, err = os.Create(d.path("backend.log")); err != nil {
		return err
	}
	cmd := exec.Command(o.backendBinary,
		"--listen-address", o.listenAddress,
		"--external-url", d.baseURL,
		"--oidc-issuer-url", d.idp.IssuerURL,
		"--oidc-issuer-client-id", d.idp.ClientID,
		"--kubeconfig", d.cp.AdminKubeconfigPath(),
		"--pretty-name", o.prettyName,
		"--log-format", "text",
		"--shutdown-timeout", "5s",
	)
	// Secrets through the environment, not the command line (which ps shows).
	cmd.Env = append(os.Environ(),
		"KUBE_BIND_OIDC_ISSUER_CLIENT_SECRET="+clientSecret,
		"KUBE_BIND_COOKIE_SIGNING_KEY="+signing,
		"KUBE_BIND_COOKIE_ENCRYPTION_KEY="+encryption,
	)
	cmd.Stdout, cmd.Stderr = d.backendLog, d.backendLog
	// Its own process group: a Ctrl-C on the terminal reaches only the demo,
	// which stops the backend gracefully; the parent-death signal ends it if
	// the demo dies without doing so.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		d.backendLog.Close()
		return err
	}
	d.backend = cmd
	d.backendExited = make(chan error, 1)
	d.backendDone = make(chan struct{})
	go func() {
		d.backendExited <- cmd.Wait()
		close(d.backendDone)
	}()

	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.baseURL+"/readyz?verbose", nil)
		if resp, err := client.Do(req); err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		select {
		case <-d.backendDone:
			return fmt.Errorf("exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s (/readyz: %s)", readyTimeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends what start started, in reverse order; safe after a partial start.
func (d *demo) stop() {
	if d.backend != nil {
		select {
		case <-d.backendDone:
		default:
			// SIGTERM: the backend finishes in-flight requests and exits.
			_ = d.backend.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.backendDone:
			case <-time.After(backendStopMax):
				d.step("the backend did not stop within %s; killing it", backendStopMax)
				_ = syscall.Kill(-d.backend.Process.Pid, syscall.SIGKILL)
				<-d.backendDone
			}
		}
		d.backendLog.Close()
	}
	if d.idp != nil {
		d.idp.Stop()
	}
	if d.idpLog != nil {
		d.idpLog.Close()
	}
	if d.cp != nil {
		d.cp.Stop()
		// The logs stay; etcd's data (tens of MB) need not.
		_ = os.RemoveAll(filepath.Join(d.cp.LogDir(), "etcd"))
	}
}

// exampleAPIs are the provider's APIs in the demo: two that consumers can
// bind, and one that is not exported (and so never offered).
var exampleAPIs = []exampleapis.API{exampleapis.MangoDB, exampleapis.Redis, exampleapis.SecretThing}

func describeAPIs() string {
	var names []string
	for _, a := range exampleAPIs {
		if a.Exported {
			names = append(names, a.Name()+" (exported)")
		} else {
			names = append(names, a.Name()+" (not exported)")
		}
	}
	return strings.Join(names, ", ")
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }

func randomKey(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}
