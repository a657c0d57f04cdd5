package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// Idle keep-alive connections never keep a new client out: 64 addresses
// hold 4 idle connections each, filling --max-connections (256), and a new
// client is answered within a second (an idle connection is closed for
// it), not after the 120 s idle timeout.
func TestIdleConnectionsAtTheCapMakeRoom(t *testing.T) {
	const addrs, perAddr = 64, 4
	bin := buildBackend(t)
	addr := fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
	diag := fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
	cmd := exec.Command(bin, "--listen-address", addr, "--diagnostics-address", diag,
		"--max-connections", fmt.Sprint(addrs*perAddr), "--max-connections-per-client", fmt.Sprint(perAddr),
		"--log-format", "json")
	cmd.Env = os.Environ()
	logs := startProcess(t, cmd)
	waitHealthy(t, "http://"+addr, logs)
	// waitHealthy's connection from 127.0.0.1 idles too: the hogs use
	// other addresses.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	from := func(ip net.IP, conns int) *http.Client {
		tr := &http.Transport{MaxIdleConnsPerHost: conns,
			DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	get := func(c *http.Client) error {
		resp, err := c.Get("http://" + addr + "/healthz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	// Each hog connection makes one keep-alive request and stays open.
	for i := range addrs {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}, Timeout: 10 * time.Second}
		for range perAddr {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatalf("address %d: %v", i+1, err)
			}
			t.Cleanup(func() { c.Close() })
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("address %d: %v", i+1, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("address %d: status %d", i+1, resp.StatusCode)
			}
		}
	}
	time.Sleep(100 * time.Millisecond)

	for i := range 3 {
		start := time.Now()
		if err := get(from(net.IPv4(127, 0, 2, byte(i+1)), 1)); err != nil {
			t.Fatalf("new client with the cap full of idle connections: %v\n%s", err, logs.String())
		}
		took := time.Since(start)
		t.Logf("new client %d answered in %s with %d idle connections from %d addresses at the cap", i+1, took, addrs*perAddr, addrs)
		if took > time.Second {
			t.Errorf("new client %d answered after %s, want within 1s", i+1, took)
		}
	}
	// The cap was full: each new client took an idle connection's place.
	resp, err := from(net.IPv4(127, 0, 3, 1), 1).Get("http://" + diag + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^kube_bind_backend_idle_connections_closed_total (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no kube_bind_backend_idle_connections_closed_total in /metrics")
	}
	if n, _ := strconv.Atoi(string(m[1])); n < 3 {
		t.Errorf("kube_bind_backend_idle_connections_closed_total %d, want at least 3", n)
	}
}
