package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// One client holding many idle connections does not keep another client
// out, even when the process may open few files: the backend runs with an
// open-file limit of 64, one address opens 100 idle connections, and a
// request from another address is answered while the first client's
// admitted connections are still open (the server closes idle ones only
// after its 10 s header timeout). Only --max-connections-per-client of the
// 100 stay open; the rest were closed at once.
func TestIdleConnectionsOfOneClientDoNotBlockOthers(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("prlimit (util-linux) is needed to run the backend with a low open-file limit: %v", err)
	}
	bin := buildBackend(t)
	addr := fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
	const perClient = 8
	cmd := exec.Command(prlimit, "--nofile=64:64", bin,
		"--listen-address", addr, "--diagnostics-address", "127.0.0.1:0",
		"--max-connections", "40",
		"--max-connections-per-client", fmt.Sprint(perClient),
		"--log-format", "json")
	cmd.Env = os.Environ()
	logs := startProcess(t, cmd)
	waitHealthy(t, "http://"+addr, logs)

	hog := make([]net.Conn, 100)
	for i := range hog {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		defer c.Close()
		hog[i] = c
	}

	// Another client (another loopback address) gets its answer.
	other := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
	}}
	resp, err := other.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("request from another client: %v\n%s", err, logs.String())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request from another client: %d", resp.StatusCode)
	}

	open := 0
	for _, c := range hog {
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		var b [1]byte
		_, err := c.Read(b[:])
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			open++
		case err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err):
		default:
			t.Fatalf("reading an idle connection: %v", err)
		}
	}
	if open != perClient {
		t.Errorf("%d of the first client's 100 idle connections open after the other client's answer, want %d\n%s", open, perClient, logs.String())
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}

// waitHealthy waits until the backend at base answers /healthz.
func waitHealthy(t *testing.T, base string, logs fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend not healthy after 30s: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
