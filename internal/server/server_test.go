package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// Run serves the public API and, for the ring, the peer API (TLS
// with a certificate derived from the peer key) and the session records
// of the provider cluster; when its context ends it drains, stops both
// and returns nil, and nothing listens any more.
func TestRunServesAndStops(t *testing.T) {
	cp := controlplane.Get(t)
	admin := controlplane.ConfigForUser(t, cp, "server-test-admin", "system:masters")
	ensureNamespace(t, admin, "kube-bind")
	peerAddr := "127.0.0.1:" + itoa(procs.FreePort(t))
	logs := &procs.Buffer{}
	cfg := testConfig(logs)
	cfg.ShutdownTimeout = 10 * time.Second
	cfg.Provider.Kubeconfig = controlplane.KubeconfigFile(t, admin)
	cfg.Store = StoreConfig{Kind: StoreRing, Namespace: "kube-bind", PeerListenAddress: peerAddr, PeerSelfURL: "https://" + peerAddr,
		PeerKeys: [][]byte{bytes.Repeat([]byte("p"), 32)}}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()
	if s.ExternalURL().String() != base {
		t.Errorf("derived external URL %s, want %s", s.ExternalURL(), base)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	testutil.Await(t, "the backend is ready", func() bool {
		resp, err := http.Get("http://" + s.DiagnosticsAddr().String() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The peer API answers on its own listener, and only over TLS with a
	// client certificate: a plain request or an anonymous TLS client is
	// refused before any handler.
	if resp, err := http.Get("http://" + peerAddr + "/"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the peer API: %d, want 400 (a TLS server)", resp.StatusCode)
		}
	}
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := anon.Get("https://" + peerAddr + "/"); err == nil {
		resp.Body.Close()
		t.Fatalf("an anonymous TLS client reached the peer API: %d", resp.StatusCode)
	}
	// A second backend cannot take the peer port: New fails and releases
	// what it opened.
	cfg.ListenAddress, cfg.DiagnosticsAddress = "127.0.0.1:0", "127.0.0.1:0"
	if _, err := New(context.Background(), cfg); err == nil {
		t.Fatal("a second backend on the same peer address started")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v\n%s", err, logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30s after its context ended")
	}
	for _, addr := range []string{s.Addr().String(), peerAddr, s.DiagnosticsAddr().String()} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Run returned", addr)
		}
	}
	if !bytes.Contains([]byte(logs.String()), []byte(`"msg":"stopped"`)) {
		t.Errorf("no stopped log:\n%s", logs)
	}
}

// New fails, releasing the public listener, when a part cannot be built.
func TestNewReleasesWhatItOpened(t *testing.T) {
	addr := "127.0.0.1:" + itoa(procs.FreePort(t))
	cfg := Config{ListenAddress: addr, DiagnosticsAddress: "127.0.0.1:0", ClusterKey: clusterkey.Options{Keys: [][]byte{[]byte("too short")}}, MaxPolledSessions: 1}
	if _, err := New(context.Background(), cfg); err == nil {
		t.Fatal("New accepted a short cluster secret key")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the listener of the failed New is still open: %v", err)
	}
	ln.Close()

	// The diagnostics port taken: New fails, saying so.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg = testConfig(&procs.Buffer{})
	cfg.ListenAddress, cfg.DiagnosticsAddress = addr, taken.Addr().String()
	if _, err := New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "diagnostics address") {
		t.Fatalf("New with the diagnostics port taken: %v", err)
	}
	if ln, err = net.Listen("tcp", addr); err != nil {
		t.Fatalf("the public listener of the failed New is still open: %v", err)
	}
	ln.Close()
}

// testConfig is a valid configuration with the memory store that logs
// JSON to logs.
func testConfig(logs *procs.Buffer) Config {
	return Config{
		ListenAddress:      "127.0.0.1:0",
		DiagnosticsAddress: "127.0.0.1:0",
		Logger:             slog.New(slog.NewJSONHandler(logs, nil)),
		ClusterKey:         clusterkey.Options{Keys: [][]byte{bytes.Repeat([]byte("k"), 32)}},
		PrettyName:         "Test",
		SessionTTL:         time.Minute,
		PollInterval:       time.Second,
		GracePeriod:        time.Minute,
		MaxPolledSessions:  10,
		Store:              StoreConfig{Kind: StoreMemory},
	}
}

func itoa(n int) string { return (&net.TCPAddr{Port: n}).String()[1:] }

// Shutdown answers held long polls at once (pending) instead of draining
// them for their whole wait.
func TestShutdownReleasesLongPolls(t *testing.T) {
	logs := &procs.Buffer{}
	cfg := testConfig(logs)
	cfg.ShutdownTimeout = time.Minute
	cfg.LongPoll = longpoll.Options{MaxWait: 40 * time.Second, MaxHeld: 10}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	metrics := func() string {
		resp, err := http.Get("http://" + s.DiagnosticsAddr().String() + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	testutil.Await(t, "the backend serves", func() bool { return metrics() != "" })

	resp, err := http.Post(base+"/sessions", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ps v1alpha1.PollSession
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	pollURL, _ := url.Parse(base + "/poll")
	u, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, http.MethodGet, pollURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	polled := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
		req.Header.Set("Prefer", "wait=40")
		resp, err := http.DefaultClient.Do(req)
		polled <- answer{resp, err}
	}()
	testutil.Await(t, "the poll is held", func() bool {
		select {
		case a := <-polled:
			b, _ := io.ReadAll(a.resp.Body)
			t.Fatalf("poll answered: %v %d %s", a.err, a.resp.StatusCode, b)
		default:
		}
		return strings.Contains(metrics(), "kube_bind_backend_long_polls_held 1\n")
	})

	stopped := time.Now()
	cancel()
	select {
	case a := <-polled:
		if a.err != nil {
			t.Fatal(a.err)
		}
		b, _ := io.ReadAll(a.resp.Body)
		a.resp.Body.Close()
		if a.resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), v1alpha1.ErrorAuthorizationPending) ||
			a.resp.Header.Get("Preference-Applied") != "wait=40" {
			t.Fatalf("held poll at shutdown: %d %s %v", a.resp.StatusCode, b, a.resp.Header)
		}
		if took := time.Since(stopped); took > 30*time.Second {
			t.Fatalf("the held poll was answered %s after shutdown began, not at once", took)
		}
	case <-time.After(35 * time.Second):
		t.Fatal("the held poll was not answered when shutdown began")
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v\n%s", err, logs)
	}
}

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

func ensureNamespace(t *testing.T, cfg *rest.Config, name string) {
	t.Helper()
	client := kubernetes.NewForConfigOrDie(cfg)
	_, err := client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
