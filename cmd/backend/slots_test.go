package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// Connections that hold a slot without a request in flight never keep a
// new client out: 64 addresses hold 64 connections each, filling the
// default --max-connections (4096) with the default per-client cap (64),
// and a 65th client is answered within a second. The connections are
// either keep-alive ones idle after a request, or ones that were accepted
// and never sent a byte (to the server they are new, not idle).
func TestSlotsHeldWithoutRequestsDoNotDelayNewClients(t *testing.T) {
	const addrs, perAddr = 64, 64
	// The test holds 4096 connections; the backend the other ends.
	raiseOpenFileLimit(t, addrs*perAddr+512)
	bin := buildBackend(t)

	for _, tc := range []struct {
		name string
		// hold opens a connection that holds a slot.
		hold func(d *net.Dialer, addr string) (net.Conn, error)
	}{
		{"idle after a request", func(d *net.Dialer, addr string) (net.Conn, error) {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				c.Close()
				return nil, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return c, nil
		}},
		{"no request sent", func(d *net.Dialer, addr string) (net.Conn, error) {
			return d.Dial("tcp", addr)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
			cmd := exec.Command(bin, "--listen-address", addr, "--log-format", "json")
			cmd.Env = os.Environ()
			logs := startProcess(t, cmd)
			waitHealthy(t, "http://"+addr, logs)
			http.DefaultTransport.(*http.Transport).CloseIdleConnections()

			// 127.0.1.1 to 127.0.1.64, in parallel per address.
			var wg sync.WaitGroup
			errs := make(chan error, addrs)
			var mu sync.Mutex
			var held []net.Conn
			t.Cleanup(func() {
				for _, c := range held {
					c.Close()
				}
			})
			start := time.Now()
			for i := range addrs {
				wg.Go(func() {
					d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}, Timeout: 10 * time.Second}
					for range perAddr {
						c, err := tc.hold(d, addr)
						if err != nil {
							errs <- fmt.Errorf("address %d: %w", i+1, err)
							return
						}
						mu.Lock()
						held = append(held, c)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("%v\n%s", err, logs.String())
			}
			t.Logf("%d connections from %d addresses held after %s", len(held), addrs, time.Since(start).Round(time.Millisecond))
			// Let the backend accept all of them (it never answers the
			// silent ones, so there is nothing to wait for but time).
			time.Sleep(500 * time.Millisecond)

			for i := range 3 {
				c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
					DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, byte(i+1))}}).DialContext,
				}}
				start := time.Now()
				resp, err := c.Get("http://" + addr + "/healthz")
				took := time.Since(start)
				if err != nil {
					t.Fatalf("new client %d after %s: %v", i+1, took, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				t.Logf("new client %d answered %d in %s with %d connections from %d addresses held", i+1, resp.StatusCode, took.Round(100*time.Microsecond), addrs*perAddr, addrs)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("new client %d: status %d", i+1, resp.StatusCode)
				}
				if took > time.Second {
					t.Errorf("new client %d answered after %s, want within 1s", i+1, took)
				}
			}
			// The cap was full: the first new client took the place of
			// a held connection, which the backend closed (the later
			// ones may take that of an earlier new client's keep-alive
			// connection, idle, which goes first).
			closed := 0
			for _, c := range held {
				c.SetReadDeadline(time.Now().Add(time.Millisecond))
				var ne net.Error
				if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
					closed++
				}
			}
			if closed < 1 {
				t.Errorf("no held connection was closed: the cap was not full")
			}
			t.Logf("%d held connections closed", closed)
		})
	}
}

// raiseOpenFileLimit raises this process's soft open-file limit to n (at
// most the hard limit); the test fails when the hard limit is lower.
func raiseOpenFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if r.Cur >= n {
		return
	}
	if r.Max < n {
		t.Fatalf("the test needs %d open files, the hard limit is %d (raise it: ulimit -Hn)", n, r.Max)
	}
	r.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
}
