package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// Every anonymous route that creates something draws from one bucket per
// client (--session-create-rate; burst three seconds' worth): the v1alpha2
// POST /api/sessions, the v1alpha1 POST /sessions and the v1alpha2 login
// starts GET /api/authorize and GET /. Beyond the burst each is answered
// 429 with Retry-After, before it would do anything else (here the login
// starts would answer 503: no identity provider is configured); another
// address is another client, and HEAD, which creates nothing, is not
// counted.
func TestCreatingRoutesArePacedPerClient(t *testing.T) {
	bin := buildBackend(t)
	addr := fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
	cmd := exec.Command(bin, "--listen-address", addr, "--session-create-rate", "1", "--log-format", "json")
	cmd.Env = os.Environ()
	logs := startProcess(t, cmd)
	waitHealthy(t, "http://"+addr, logs)

	from := func(ip net.IP) *http.Client {
		return &http.Client{Timeout: 30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport:     &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext}}
	}
	a, b := from(net.IPv4(127, 0, 4, 1)), from(net.IPv4(127, 0, 4, 2))
	do := func(c *http.Client, method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}

	// The burst: three, whichever route they go to.
	for _, path := range []string{"/api/sessions", "/sessions", "/api/sessions"} {
		if resp, body := do(a, "POST", path); resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s within the burst: %d %s", path, resp.StatusCode, body)
		}
	}
	resp, body := do(a, "POST", "/api/sessions")
	var e struct{ Error string }
	if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal([]byte(body), &e) != nil || e.Error != "slow_down" {
		t.Errorf("POST /api/sessions beyond the burst: %d %s, want 429 slow_down", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("POST /api/sessions beyond the burst: Retry-After %q, want 1", ra)
	}
	if resp, body := do(a, "POST", "/sessions"); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("POST /sessions beyond the shared burst: %d %s", resp.StatusCode, body)
	}
	for _, path := range []string{"/api/authorize?redirect_url=http://127.0.0.1:9/callback&session_id=x", "/?redirect_url=http://127.0.0.1:9/callback&session_id=x"} {
		resp, body := do(a, "GET", path)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "Try again") {
			t.Errorf("GET %s beyond the burst: %d (Retry-After %q) %s, want 429", path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if resp, _ := do(a, "HEAD", path); resp.StatusCode == http.StatusTooManyRequests {
			t.Errorf("HEAD %s, which creates nothing, was paced", path)
		}
		// Another client still has its burst: it gets what the route
		// answers without an identity provider.
		if resp, body := do(b, "GET", path); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("GET %s from another client: %d %s, want 503", path, resp.StatusCode, body)
		}
	}
	if resp, body := do(b, "POST", "/api/sessions"); resp.StatusCode != http.StatusCreated {
		t.Errorf("POST /api/sessions from another client: %d %s", resp.StatusCode, body)
	}
	// One token a second comes back.
	time.Sleep(1100 * time.Millisecond)
	if resp, body := do(a, "POST", "/api/sessions"); resp.StatusCode != http.StatusCreated {
		t.Errorf("POST /api/sessions a second later: %d %s", resp.StatusCode, body)
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("refusals logged at ERROR:\n%s", logs.String())
	}
}
