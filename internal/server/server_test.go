package server

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions/hashring"
	"github.com/kbprovider/backend/internal/testutil/await"
	"github.com/kbprovider/backend/internal/testutil/procs"
)

// Run serves the public API and, for the hashring, the peer API; when its
// context ends it drains, stops both and returns nil, and nothing listens
// any more.
func TestRunServesAndStops(t *testing.T) {
	peerAddr := "127.0.0.1:" + itoa(procs.FreePort(t))
	logs := &procs.Buffer{}
	cfg := Config{
		ListenAddress:      "127.0.0.1:0",
		Logger:             slog.New(slog.NewJSONHandler(logs, nil)),
		ClusterSecretKey:   bytes.Repeat([]byte("k"), 32),
		PrettyName:         "Test",
		SessionTTL:         time.Minute,
		PollInterval:       time.Second,
		GracePeriod:        time.Minute,
		MaxPendingSessions: 10,
		ShutdownTimeout:    10 * time.Second,
		Store: StoreConfig{Kind: StoreHashring, PeerListenAddress: peerAddr, PeerSelfURL: "http://" + peerAddr,
			PeerKey: bytes.Repeat([]byte("p"), hashring.MinKeyBytes)},
	}
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
	await.True(t, "the backend is ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The peer API answers on its own listener (a GET is refused).
	resp, err := http.Get("http://" + peerAddr + hashring.PeerPath)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("peer API: %v %v, want 405", resp, err)
	}
	resp.Body.Close()
	// A second backend cannot take the peer port: New fails and releases
	// what it opened.
	cfg.ListenAddress = "127.0.0.1:0"
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
	for _, addr := range []string{s.Addr().String(), peerAddr} {
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
	cfg := Config{ListenAddress: addr, ClusterSecretKey: []byte("too short"), MaxPendingSessions: 1}
	if _, err := New(context.Background(), cfg); err == nil {
		t.Fatal("New accepted a short cluster secret key")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the listener of the failed New is still open: %v", err)
	}
	ln.Close()
}

func itoa(n int) string { return (&net.TCPAddr{Port: n}).String()[1:] }
