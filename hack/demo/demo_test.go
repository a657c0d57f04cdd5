package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	"github.com/kbprovider/backend/web"
)

// demoRun is hack/demo.sh running as a separate process.
type demoRun struct {
	cmd              *exec.Cmd
	stdout           io.Reader
	stderr           *procs.Buffer
	exited           chan error
	state            string
	listen, oidcAddr string
	diagAddr         string
	stopped          bool // the test stops it itself
}

// startDemo runs hack/demo.sh on free ports, as a user would; env adds
// environment variables.
func startDemo(t *testing.T, env ...string) *demoRun {
	t.Helper()
	root := procs.RepoRoot()
	// The demo would build the Kubernetes binaries if they were missing:
	// minutes, not for a test to start by surprise.
	if out, err := exec.Command("bash", filepath.Join(root, "hack/install-test-binaries.sh"), "--print-dir").CombinedOutput(); err != nil {
		t.Fatalf("the Kubernetes binaries are not built: run hack/install-test-binaries.sh (or hack/test.sh): %s", out)
	}
	if _, err := os.Stat(filepath.Join(oidcprovider.Dir(), "node_modules", "oidc-provider")); err != nil {
		t.Fatal("the OIDC provider's npm packages are missing: run hack/install-test-deps.sh")
	}

	d := &demoRun{state: filepath.Join(t.TempDir(), "state"), listen: freeAddr(t), oidcAddr: freeAddr(t), diagAddr: freeAddr(t), stderr: &procs.Buffer{}, exited: make(chan error, 1)}
	cmd := exec.Command("bash", "hack/demo.sh", "--listen-address", d.listen, "--oidc-address", d.oidcAddr, "--diagnostics-address", d.diagAddr, "--state-dir", d.state)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	// If this test dies, the demo dies too, and with it what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = d.stderr
	var err error
	if d.stdout, err = cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.cmd = cmd
	go func() { d.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if !d.stopped {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
			}
		}
		if t.Failed() {
			t.Logf("demo stderr:\n%s", d.stderr.String())
			for _, f := range []string{"backend.log", "oidc-provider.log"} {
				b, _ := os.ReadFile(filepath.Join(d.state, f))
				t.Logf("%s:\n%s", f, tail(string(b), 30))
			}
		}
	})
	return d
}

// interrupt sends SIGINT, as Ctrl-C does, and checks that the demo exits
// with want and that every process it ran at the time of the signal is gone.
func (d *demoRun) interrupt(t *testing.T, wantCode int) {
	t.Helper()
	running := descendants(d.cmd.Process.Pid)
	d.stopped = true
	begin := time.Now()
	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
		if code := d.cmd.ProcessState.ExitCode(); code != wantCode {
			t.Errorf("demo exited with %d after SIGINT, want %d", code, wantCode)
		}
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Fatal("demo did not stop within 30s of SIGINT")
	}
	t.Logf("stopped %d processes %v in %s after SIGINT", len(running), slices.Sorted(maps.Values(running)), time.Since(begin).Round(time.Millisecond))
	var left []string
	for pid, name := range running {
		if procs.Alive(pid) {
			left = append(left, fmt.Sprintf("%d (%s)", pid, name))
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if len(left) > 0 {
		t.Errorf("processes left after the demo stopped: %v", left)
	}
	for _, addr := range []string{d.listen, d.oidcAddr} {
		if l, err := net.Listen("tcp", addr); err != nil {
			t.Errorf("%s still taken after the demo stopped: %v", addr, err)
		} else {
			l.Close()
		}
	}
	for _, cluster := range []string{"controlplane", "consumer-controlplane"} {
		if _, err := os.Stat(filepath.Join(d.state, cluster, "etcd")); err == nil {
			t.Errorf("etcd's data left in the state folder's %s after the stop", cluster)
		}
	}
}

// TestDemo runs the README's first command, hack/demo.sh, as a user would
// (on free ports), binds an API into the demo's consumer cluster with the
// one printed command and the printed credentials, uses the API there as
// printed (the konnector the demo runs syncs an object to the provider),
// and stops the demo with SIGINT: every process it started must be gone.
func TestDemo(t *testing.T) {
	d := startDemo(t)
	listen, oidcAddr := d.listen, d.oidcAddr
	// Wait for the ready text; a cold build of the three binaries counts in.
	ready := readReady(t, d.stdout, d.exited, 5*time.Minute)
	t.Logf("demo output:\n%s", ready.text)

	base := "http://" + listen
	if ready.exportURL != base+"/export" {
		t.Errorf("export URL %q, want %s/export", ready.exportURL, base)
	}
	if ready.issuer != "http://"+oidcAddr {
		t.Errorf("identity provider %q, want http://%s", ready.issuer, oidcAddr)
	}
	if m := regexp.MustCompile(`came up in ([0-9]+h)?([0-9]+m)?[0-9.]+(ms|s)\b`).FindStringSubmatch(ready.text); m == nil {
		t.Error("the ready text does not say how long the start took")
	}

	// The printed kubectl command works against the provider cluster.
	if out, err := ready.run("get namespaces"); err != nil || !strings.Contains(out, "kube-system") {
		t.Errorf("the provider cluster's get namespaces: %v\n%s", err, out)
	}
	// The kubectl plugin form's PATH holds kubectl and the plugin.
	for _, f := range []string{"kubectl", "kubectl-bind_poll"} {
		if !slices.ContainsFunc(ready.pluginPath, func(dir string) bool {
			st, err := os.Stat(filepath.Join(dir, f))
			return err == nil && st.Mode()&0o111 != 0
		}) {
			t.Errorf("%s is not on the printed PATH %v", f, ready.pluginPath)
		}
	}

	pressed, providerNS := bindWithPollCommand(t, ready, base)
	useBoundAPI(t, d, ready, providerNS, pressed)
	bindWithReleasedCLI(t, ready, base)

	// Should the konnector die, the demo runs it again, as a kubelet would.
	const runs = "running it here as ServiceAccount kube-bind/konnector"
	killed := 0
	for pid, name := range descendants(d.cmd.Process.Pid) {
		if name == "konnector" {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed = pid
		}
	}
	if killed == 0 {
		t.Error("no konnector process to kill")
	} else {
		eventually(t, time.Minute, "the demo to run the konnector again", func() (bool, string) {
			again := false
			for pid, name := range descendants(d.cmd.Process.Pid) {
				again = again || (name == "konnector" && pid != killed)
			}
			return again && strings.Count(d.stderr.String(), runs) == 2, tail(d.stderr.String(), 3)
		})
	}

	// Ctrl-C: the demo stops everything it started.
	running := descendants(d.cmd.Process.Pid)
	if len(running) < 9 {
		t.Errorf("the demo runs %d processes, want at least etcd, kube-apiserver and kube-controller-manager twice, node, the backend, netbridge and the konnector: %v", len(running), running)
	}
	if !slices.Contains(slices.Collect(maps.Values(running)), "konnector") {
		t.Errorf("no konnector among the demo's processes: %v", running)
	}
	d.interrupt(t, 0)
	if !strings.Contains(d.stderr.String(), "demo: stopped in") {
		t.Errorf("the demo did not report its stop:\n%s", tail(d.stderr.String(), 5))
	}
	for _, f := range []string{"backend.log", "oidc-provider.log", "konnector.log", "controlplane/kube-apiserver.log", "consumer-controlplane/kube-apiserver.log"} {
		if _, err := os.Stat(filepath.Join(d.state, f)); err != nil {
			t.Errorf("log %s not kept: %v", f, err)
		}
	}
}

// TestDemoWithoutKonnector starts the demo where the released konnector
// cannot be found: it says so, prints the bind command with
// --skip-konnector, and that command binds (the APIServiceBinding exists)
// with nothing that would sync.
func TestDemoWithoutKonnector(t *testing.T) {
	d := startDemo(t, konnector.PeersEnv+"="+filepath.Join(t.TempDir(), "no-such-release"))
	ready := readReady(t, d.stdout, d.exited, 5*time.Minute)
	if !slices.Contains(ready.poll, "--skip-konnector") {
		t.Errorf("the printed bind command %v lacks --skip-konnector", ready.poll)
	}
	for _, want := range []string{"was not found", "bound (the APIServiceBindings", "not synced", konnector.PeersEnv} {
		if !strings.Contains(ready.text, want) {
			t.Errorf("the ready text does not say %q:\n%s", want, ready.text)
		}
	}
	if !strings.Contains(d.stderr.String(), "no released konnector") {
		t.Errorf("the demo's log does not say the konnector is missing:\n%s", d.stderr.String())
	}

	bindWithPollCommand(t, ready, "http://"+d.listen)
	i := slices.Index(ready.poll, "--kubeconfig")
	if i < 0 || i+1 >= len(ready.poll) {
		t.Fatalf("the bind command %v names no --kubeconfig", ready.poll)
	}
	consumerCfg, err := clientcmd.BuildConfigFromFlags("", ready.poll[i+1])
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(consumerCfg)
	if _, err := dyn.Resource(apply.BindingV1alpha2GVR).Get(ctx, exampleapis.MangoDB.Name(), metav1.GetOptions{}); err != nil {
		t.Errorf("APIServiceBinding %s in the consumer cluster: %v", exampleapis.MangoDB.Name(), err)
	}
	deployments := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	if _, err := dyn.Resource(deployments).Namespace("kube-bind").Get(ctx, "konnector", metav1.GetOptions{}); err == nil {
		t.Error("the bind command deployed a konnector despite --skip-konnector")
	}
	running := descendants(d.cmd.Process.Pid)
	if slices.Contains(slices.Collect(maps.Values(running)), "konnector") {
		t.Errorf("a konnector runs: %v", running)
	}
	d.interrupt(t, 0)
}

// TestDemoInterruptedWhileStarting presses Ctrl-C while the demo is still
// starting (the control plane is up, the rest is on its way): it stops what
// it started and exits 1.
func TestDemoInterruptedWhileStarting(t *testing.T) {
	d := startDemo(t)
	deadline := time.After(5 * time.Minute)
	for !strings.Contains(d.stderr.String(), "control plane up at") {
		select {
		case err := <-d.exited:
			t.Fatalf("demo exited (%v) while starting", err)
		case <-deadline:
			t.Fatal("the control plane did not come up within 5 minutes")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if procs := descendants(d.cmd.Process.Pid); len(procs) < 3 {
		t.Errorf("the demo runs %d processes, want at least etcd, kube-apiserver and kube-controller-manager: %v", len(procs), procs)
	}
	d.interrupt(t, 1)
	if !strings.Contains(d.stderr.String(), "interrupted while starting") {
		t.Errorf("the demo did not say it was interrupted:\n%s", tail(d.stderr.String(), 5))
	}
}

// readyText is what the demo prints once everything runs.
type readyText struct {
	text              string
	exportURL, issuer string
	user, password    string
	poll              []string   // the bind command as printed
	kubectl           [][]string // the kubectl commands as printed
	released          [][]string // the released kubectl-bind commands as printed
	pluginPath        []string   // the PATH printed for the kubectl plugin form
}

// run runs the printed kubectl command that ends with args (e.g. "get
// namespaces"), with the kubeconfig as printed.
func (r readyText) run(args string) (string, error) {
	for _, c := range r.kubectl {
		if strings.HasSuffix(strings.Join(c, " "), " "+args) {
			out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
			return string(out), err
		}
	}
	return "", fmt.Errorf("no printed kubectl command ends with %q", args)
}

// kubeconfigOf is the kubeconfig of the printed kubectl command that ends
// with args.
func (r readyText) kubeconfigOf(t *testing.T, args string) string {
	t.Helper()
	for _, c := range r.kubectl {
		if i := slices.Index(c, "--kubeconfig"); i > 0 && i+1 < len(c) && strings.HasSuffix(strings.Join(c, " "), " "+args) {
			return c[i+1]
		}
	}
	t.Fatalf("no printed kubectl command with --kubeconfig ends with %q:\n%s", args, r.text)
	return ""
}

func readReady(t *testing.T, stdout io.Reader, exited <-chan error, timeout time.Duration) readyText {
	t.Helper()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var r readyText
	var all strings.Builder
	deadline := time.After(timeout)
	field := func(line, label string) (string, bool) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), label)
		return strings.TrimSpace(rest), ok
	}
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("demo closed its output before it was ready:\n%s", all.String())
			}
			all.WriteString(line + "\n")
			if v, ok := field(line, "Export URL:"); ok {
				r.exportURL = v
			}
			if v, ok := field(line, "Demo user:"); ok {
				r.user = v
			}
			if v, ok := field(line, "Password:"); ok {
				r.password = v
			}
			if v, ok := field(line, "(identity provider at"); ok {
				r.issuer = strings.TrimSuffix(v, ")")
			}
			if f := strings.Fields(line); len(f) > 0 && strings.HasSuffix(f[0], "/kube-bind-poll") {
				r.poll = f
			}
			if f := strings.Fields(line); len(f) > 0 && strings.HasSuffix(f[0], "/kubectl") {
				r.kubectl = append(r.kubectl, f)
			}
			if f := strings.Fields(line); len(f) > 0 && strings.HasSuffix(f[0], "/kubectl-bind") {
				r.released = append(r.released, f)
			}
			if v, ok := field(line, "export PATH="); ok {
				r.pluginPath = strings.Split(strings.TrimSuffix(v, ":$PATH"), ":")
			}
			if strings.Contains(line, "Press Ctrl-C to stop everything") {
				r.text = all.String()
				if r.exportURL == "" || r.user == "" || r.password == "" || r.issuer == "" || r.poll == nil || r.kubectl == nil || r.pluginPath == nil {
					t.Fatalf("the ready text lacks the export URL, user, password, identity provider, bind command, kubectl commands or the plugin's PATH:\n%s", r.text)
				}
				go func() { // keep draining
					for range lines {
					}
				}()
				return r
			}
		case err := <-exited:
			t.Fatalf("demo exited (%v) before it was ready:\n%s", err, all.String())
		case <-deadline:
			t.Fatalf("demo not ready after %s:\n%s", timeout, all.String())
		}
	}
}

// bindWithReleasedCLI runs the printed commands of the released
// kubectl-bind: its login (the test plays the browser) and its template
// bind, which must end with the APIServiceBinding in the consumer cluster.
func bindWithReleasedCLI(t *testing.T, ready readyText, base string) {
	t.Helper()
	var login, template []string
	for _, c := range ready.released {
		switch {
		case len(c) > 1 && c[1] == "login":
			login = c
		case len(c) > 1 && c[1] == "apiservice":
			template = c
		}
	}
	if login == nil || template == nil {
		t.Fatalf("the demo printed no login and template commands of the released kubectl-bind: %v", ready.released)
	}
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := procs.Start(t, home, login[0], append(login[1:], "--skip-browser"), "HOME="+home, "KUBECONFIG=")
	authURL := c.URL(t)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	back, err := oidcprovider.Attach(ready.issuer, base+"/callback").Login(ctx, client, authURL, ready.user, ready.password)
	if err != nil {
		t.Fatalf("logging in as %s: %v", ready.user, err)
	}
	// The backend's callback hands the token to the CLI's own callback.
	resp, err := client.Get(back.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code := c.Wait(t, time.Minute); code != 0 {
		t.Fatalf("kubectl-bind login: exit %d", code)
	}
	bind := procs.Start(t, home, template[0], template[1:], "HOME="+home, "KUBECONFIG=")
	if code := bind.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("kubectl-bind apiservice: exit %d", code)
	}
	if out, err := ready.run("get apiservicebindings"); err != nil || !strings.Contains(out, "redises") {
		t.Errorf("after the released CLI's bind, get apiservicebindings: %v\n%s", err, out)
	}
}

// bindWithPollCommand runs the printed bind command, logs the demo user in
// at the printed URL the way a browser would, picks one API on the
// selection page, confirms and binds; it waits for the command to exit 0
// and returns when Bind was pressed and the provider namespace the command
// named.
func bindWithPollCommand(t *testing.T, ready readyText, base string) (time.Time, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	poll := exec.CommandContext(ctx, ready.poll[0], ready.poll[1:]...)
	// A user's machine: no kubeconfig but the one the command names.
	poll.Env = append(os.Environ(), "HOME="+t.TempDir(), "KUBECONFIG=")
	pollErr := &procs.Buffer{}
	poll.Stderr = pollErr
	if err := poll.Start(); err != nil {
		t.Fatal(err)
	}
	pollDone := make(chan error, 1)
	go func() { pollDone <- poll.Wait() }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s stderr:\n%s", strings.Join(ready.poll, " "), pollErr.String())
		}
	})

	var authURL string
	for authURL == "" {
		for _, line := range strings.Split(pollErr.String(), "\n") {
			if s := strings.TrimSpace(line); strings.HasPrefix(s, base+"/authorize?") {
				authURL = s
			}
		}
		if authURL != "" {
			break
		}
		select {
		case err := <-pollDone:
			t.Fatalf("the bind command exited (%v) before printing the URL:\n%s", err, pollErr.String())
		case <-ctx.Done():
			t.Fatalf("the bind command printed no URL:\n%s", pollErr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}

	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	idp := oidcprovider.Attach(ready.issuer, base+"/callback")
	back, err := idp.Login(ctx, client, authURL, ready.user, ready.password)
	if err != nil {
		t.Fatalf("logging in as %s: %v", ready.user, err)
	}
	if back.Query().Get("code") == "" {
		t.Fatalf("the identity provider sent no code: %s", back)
	}
	// The backend's callback leads to the selection page.
	resp, err := client.Get(back.String())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Request.URL.String(), base+"/bind") {
		t.Fatalf("after login: %s at %s:\n%.2000s", resp.Status, resp.Request.URL, page)
	}
	form := testutil.FormOn(t, page, http.MethodPost)
	for _, a := range exampleAPIs {
		if offered := slices.Contains(form.Checkboxes[web.FieldAPI], a.Name()); offered != a.Exported {
			t.Errorf("selection page offers %v, want exactly the exported example APIs", form.Checkboxes[web.FieldAPI])
		}
	}
	if form.Fields.Get(web.FieldCSRF) == "" {
		t.Fatal("selection form has no CSRF token")
	}
	values := form.Fields
	values.Set(web.FieldAPI, exampleapis.MangoDB.Name())
	values.Set(web.FieldAction, web.ActionBind)
	// The box by which the user confirms the code the command printed.
	values.Set(web.FieldConfirm, web.ConfirmYes)
	action, err := resp.Request.URL.Parse(form.Action)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, action.String(), strings.NewReader(values.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base) // as a browser sends it
	pressed := time.Now()
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(strings.ToLower(string(page)), "terminal") {
		t.Fatalf("bind answered %s:\n%.2000s", resp.Status, page)
	}

	select {
	case err := <-pollDone:
		if err != nil {
			t.Fatalf("the bind command failed (%v):\n%s", err, pollErr.String())
		}
	case <-ctx.Done():
		t.Fatalf("the bind command did not finish:\n%s", pollErr.String())
	}
	t.Logf("from pressing Bind to the bind command exiting with the API bound: %s", time.Since(pressed).Round(time.Millisecond))
	t.Logf("bind command output:\n%s", pollErr.String())
	m := regexp.MustCompile(`in namespace (\S+) on `).FindStringSubmatch(pollErr.String())
	if m == nil {
		t.Fatalf("the bind command did not name the provider namespace:\n%s", pollErr.String())
	}
	return pressed, m[1]
}

// useBoundAPI checks what the bind left in the consumer cluster and uses
// the API as the demo printed: the APIServiceBinding names the kubeconfig
// Secret, whose kubeconfig works as the consumer on the provider (its own
// namespace only); a MangoDB created there with the printed command
// appears in the consumer's provider namespace, synced by the konnector
// the demo runs as the command's ServiceAccount.
func useBoundAPI(t *testing.T, d *demoRun, ready readyText, providerNS string, pressed time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	consumerCfg, err := clientcmd.BuildConfigFromFlags("", ready.kubeconfigOf(t, "get apiservicebindings"))
	if err != nil {
		t.Fatal(err)
	}
	providerCfg, err := clientcmd.BuildConfigFromFlags("", ready.kubeconfigOf(t, "get namespaces"))
	if err != nil {
		t.Fatal(err)
	}
	consumerDyn := dynamic.NewForConfigOrDie(consumerCfg)
	providerDyn := dynamic.NewForConfigOrDie(providerCfg)

	if out, err := ready.run("get apiservicebindings"); err != nil || !strings.Contains(out, exampleapis.MangoDB.Name()) {
		t.Errorf("the printed get apiservicebindings: %v\n%s", err, out)
	}
	b, err := consumerDyn.Resource(apply.BindingV1alpha2GVR).Get(ctx, exampleapis.MangoDB.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("APIServiceBinding %s in the consumer cluster: %v", exampleapis.MangoDB.Name(), err)
	}
	ref, _, _ := unstructured.NestedStringMap(b.Object, "spec", "kubeconfigSecretRef")
	if ref["namespace"] != "kube-bind" || ref["key"] != "kubeconfig" {
		t.Fatalf("APIServiceBinding %s refers to %v", b.GetName(), ref)
	}
	secret, err := dynamic.NewForConfigOrDie(consumerCfg).Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).
		Namespace(ref["namespace"]).Get(ctx, ref["name"], metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the binding's kubeconfig Secret: %v", err)
	}
	encoded, _, _ := unstructured.NestedString(secret.Object, "data", ref["key"])
	kubeconfig, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		t.Fatal(err)
	}
	useIssuedKubeconfig(t, kubeconfig, providerNS)

	// The printed create works once the konnector made the CRD.
	eventually(t, 2*time.Minute, "the printed kubectl create of my-db to work in the consumer cluster", func() (bool, string) {
		out, err := ready.run("create -f " + filepath.Join(d.state, "my-db.yaml"))
		return err == nil || strings.Contains(out, "AlreadyExists"), fmt.Sprintf("%v: %s", err, out)
	})
	mango := exampleapis.MangoDB.GVR()
	var upstream *unstructured.Unstructured
	eventually(t, 2*time.Minute, "my-db to appear on the provider", func() (bool, string) {
		list, err := providerDyn.Resource(mango).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for i := range list.Items {
			if list.Items[i].GetName() == "my-db" {
				upstream = &list.Items[i]
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d MangoDBs on the provider, none named my-db", len(list.Items))
	})
	t.Logf("from pressing Bind to my-db on the provider: %s", time.Since(pressed).Round(time.Millisecond))
	if tier, _, _ := unstructured.NestedString(upstream.Object, "spec", "tier"); tier != "gold" {
		t.Errorf("my-db upstream has spec %v, want tier gold", upstream.Object["spec"])
	}
	// In the consumer's provider namespace, or one the provider made for it.
	nsList, err := providerDyn.Resource(kbresources.APIServiceNamespaces).
		Namespace(providerNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inOurs := upstream.GetNamespace() == providerNS
	for _, n := range nsList.Items {
		ns, _, _ := unstructured.NestedString(n.Object, "status", "namespace")
		inOurs = inOurs || ns == upstream.GetNamespace()
	}
	if !inOurs {
		t.Errorf("my-db is in provider namespace %s, not one of the consumer's (%s and its APIServiceNamespaces)", upstream.GetNamespace(), providerNS)
	}
	if out, err := ready.run("get mangodbs -A"); err != nil || !strings.Contains(out, "my-db") {
		t.Errorf("the printed get mangodbs -A: %v\n%s", err, out)
	}

	if !strings.Contains(d.stderr.String(), "running it here as ServiceAccount kube-bind/konnector") {
		t.Errorf("the demo did not report running the konnector:\n%s", d.stderr.String())
	}
	log, err := os.ReadFile(filepath.Join(d.state, "konnector.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(log)), "forbidden") {
		t.Errorf("the konnector was refused something with the RBAC the bind command wrote:\n%s", tail(string(log), 30))
	}
}

// useIssuedKubeconfig shows the kubeconfig the provider issued working as
// the consumer: it names the provider namespace the command reported, may
// read the APIServiceExportRequest there, which Succeeded, and may not read
// the secrets of kube-system.
func useIssuedKubeconfig(t *testing.T, kubeconfig []byte, providerNS string) {
	t.Helper()
	cc, err := clientcmd.NewClientConfigFromBytes(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns != providerNS {
		t.Fatalf("issued kubeconfig's namespace %q (%v), want %s", ns, err, providerNS)
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(rc)
	ctx := context.Background()
	gvr := kbresources.APIServiceExportRequests
	req, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, exampleapis.MangoDB.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the consumer cannot read its APIServiceExportRequest in %s: %v", ns, err)
	}
	if phase, _, _ := unstructured.NestedString(req.Object, "status", "phase"); phase != "Succeeded" {
		t.Errorf("APIServiceExportRequest %s is %q, want Succeeded", req.GetName(), phase)
	}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	if _, err := dyn.Resource(secrets).Namespace("kube-system").List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("the consumer can read secrets in kube-system")
	}
}

// eventually checks cond every 250ms until it holds, failing the test
// after timeout with cond's last word on why not.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// descendants lists the processes below pid (pid -> command name), from /proc.
func descendants(pid int) map[int]string {
	parent := map[int]int{}
	name := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < 0 || len(s) < end+2 {
			continue
		}
		fields := strings.Fields(s[end+2:])
		if len(fields) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(fields[1])
		parent[p], name[p] = pp, s[open+1:end]
	}
	out := map[int]string{}
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out[p] = name[p]
				break
			}
		}
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
