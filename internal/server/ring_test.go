package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/hashring"
	"github.com/kbprovider/backend/internal/testutil/await"
	"github.com/kbprovider/backend/internal/testutil/procs"
)

// TestShutdownHandsSessionsOver: two replicas with static --peers become
// ready only once joined; when one is stopped (SIGTERM's context), it
// leaves the ring and hands its sessions over before it stops: the other
// replica serves them with their nonces, none is lost.
func TestShutdownHandsSessionsOver(t *testing.T) {
	peerAddrs := []string{"127.0.0.1:" + itoa(procs.FreePort(t)), "127.0.0.1:" + itoa(procs.FreePort(t))}
	urls := []string{"http://" + peerAddrs[0], "http://" + peerAddrs[1]}
	var srvs [2]*Server
	var logs [2]*procs.Buffer
	for i := range srvs {
		logs[i] = &procs.Buffer{}
		cfg := Config{
			ListenAddress:      "127.0.0.1:0",
			Logger:             slog.New(slog.NewJSONHandler(logs[i], nil)),
			ClusterSecretKey:   bytes.Repeat([]byte("k"), 32),
			PrettyName:         "Test",
			SessionTTL:         time.Minute,
			PollInterval:       time.Second,
			GracePeriod:        time.Minute,
			MaxPendingSessions: 100,
			ShutdownTimeout:    20 * time.Second,
			Store: StoreConfig{Kind: StoreHashring, PeerListenAddress: peerAddrs[i], PeerSelfURL: urls[i],
				Peers: urls, PeerKey: bytes.Repeat([]byte("p"), hashring.MinKeyBytes)},
		}
		s, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		srvs[i] = s
	}
	ctxs := make([]context.CancelFunc, 2)
	dones := make([]chan error, 2)
	for i, s := range srvs {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i], dones[i] = cancel, make(chan error, 1)
		go func() { dones[i] <- s.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-dones[i] })
	}
	for _, s := range srvs {
		await.True(t, "the replica is ready", func() bool {
			resp, err := http.Get("http://" + s.Addr().String() + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	a, b := srvs[0].ring, srvs[1].ring
	await.True(t, "both replicas are in both rings", func() bool {
		return len(a.Members()) == 2 && len(b.Members()) == 2
	})
	ctx := context.Background()
	var ids []string
	for i := 0; len(ids) < 10; i++ {
		id := fmt.Sprint("handover-", i)
		if a.Owner(id) != urls[0] {
			continue
		}
		now := time.Now()
		if err := b.Create(ctx, sessions.Session{ID: id, ClusterID: "c", Secret: "s", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if err := a.UseNonce(ctx, id, "used"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	ctxs[0]()
	select {
	case err := <-dones[0]:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		dones[0] <- nil // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatal("the stopped replica did not return")
	}
	if !bytes.Contains([]byte(logs[0].String()), []byte(`"msg":"left the session ring"`)) {
		t.Fatalf("no handover logged:\n%s", logs[0])
	}
	for _, id := range ids {
		if err := b.UseNonce(ctx, id, "used"); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("a nonce used before the handover: %v, want ErrNonceUsed", err)
		}
		if _, err := b.RecordPoll(ctx, id, "fresh", 0); err != nil {
			t.Fatalf("session %s after its owner stopped: %v", id, err)
		}
	}
	// The survivor says how many copies it failed to send: none.
	resp, err := http.Get("http://" + srvs[1].Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte("hashring_replication_failures_total")) {
		t.Fatalf("no replication failure counter in /metrics")
	}
	// and how many peer messages and requests it sent: some, in batches.
	sent := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && strings.HasPrefix(name, "hashring_peer_") {
			sent[name], _ = strconv.ParseFloat(v, 64)
		}
	}
	if m, r := sent["hashring_peer_messages_sent_total"], sent["hashring_peer_requests_sent_total"]; m < 1 || r < m {
		t.Fatalf("peer messages %v, requests %v sent: want at least one message, and requests >= messages", m, r)
	}
}
