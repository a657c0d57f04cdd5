package connlimit

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

func TestClientKey(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"}, // IPv4-mapped counts as IPv4
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::"},
		{"2001:db8:1:2::1", "2001:db8:1:2::"},
		{"2001:db8:1:3::1", "2001:db8:1:3::"},
		{"fe80::1%eth0", "fe80::"},
		{"::1", "::"},
	} {
		if got := ClientKey(netip.MustParseAddr(c.in)); got != netip.MustParseAddr(c.want) {
			t.Errorf("ClientKey(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if got := ClientOf("[2001:db8:1:2::5]:443"); got != netip.MustParseAddr("2001:db8:1:2::") {
		t.Errorf("ClientOf: %s", got)
	}
	if got := ClientOf("@"); got.IsValid() {
		t.Errorf("ClientOf of a non-IP address: %s", got)
	}
}

// fakeListener hands out pipes that claim the given remote addresses.
type fakeListener struct {
	conns chan net.Conn
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

func (f *fakeListener) Accept() (net.Conn, error) {
	c, ok := <-f.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (f *fakeListener) Close() error   { return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{} }

// An IPv6 /64 is one client: a host that picks a new address in its
// prefix for each connection still meets the per-client cap.
func TestPerClientCapCountsIPv6Prefix(t *testing.T) {
	f := &fakeListener{conns: make(chan net.Conn, 16)}
	l := New(f, 0, 2)
	send := func(ip string) net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		f.conns <- addrConn{Conn: a, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1234}}
		return b
	}
	for _, ip := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9", "2001:db8:1:2::3", "2001:db8:1:3::1", "10.0.0.1", "::ffff:10.0.0.1", "10.0.0.1", "10.0.0.2"} {
		send(ip)
	}
	close(f.conns)
	var got []string
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		got = append(got, c.RemoteAddr().String())
	}
	want := "[[2001:db8:1:2::1]:1234 [2001:db8:1:2:ffff::9]:1234 [2001:db8:1:3::1]:1234 10.0.0.1:1234 10.0.0.1:1234 10.0.0.2:1234]"
	if fmt.Sprint(got) != want {
		t.Errorf("admitted %v, want %s", got, want)
	}
	if l.Refused() != 2 {
		t.Errorf("refused %d, want 2", l.Refused())
	}
	if n := l.Open(netip.MustParseAddr("2001:db8:1:2::77")); n != 2 {
		t.Errorf("open from 2001:db8:1:2::/64: %d", n)
	}
}

func TestUnwrapTLS(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &conn{Conn: a}
	if unwrap(tls.Server(c, &tls.Config{})) != c {
		t.Fatal("the connection under a *tls.Conn was not found")
	}
	if unwrap(a) != nil {
		t.Fatal("a foreign connection was taken for the Listener's")
	}
}

// The cap is full of keep-alive connections from many addresses, idle
// between requests, and one with a request in flight; a new client is
// answered at once (an idle connection is closed for it), and the request
// in flight is not disturbed. Without closing idle connections the new
// client would wait for the server's IdleTimeout (a minute here).
func TestIdleConnectionsMakeRoomForNewClients(t *testing.T) {
	const clients = 64
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, clients, 1)
	release := make(chan struct{})
	inFlight := make(chan struct{})
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				close(inFlight)
				<-release
			}
			io.WriteString(w, "ok")
		}),
		IdleTimeout: time.Minute,
		ConnState:   l.ConnState,
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + l.Addr().String()

	from := func(ip string) *http.Client {
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	get := func(c *http.Client, path string) error {
		resp, err := c.Get(url + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	// One connection with a request in flight, the others idle.
	slow := make(chan error, 1)
	go func() { slow <- get(from("127.0.0.1"), "/slow") }()
	<-inFlight
	for i := 2; i <= clients; i++ {
		if err := get(from(fmt.Sprintf("127.0.0.%d", i)), "/"); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	// Wait until the server reported every one idle.
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		n := l.idle.Len()
		l.mu.Unlock()
		if n == clients-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections, want %d", n, clients-1)
		}
		time.Sleep(10 * time.Millisecond)
	}

	for i := range 3 {
		start := time.Now()
		if err := get(from(fmt.Sprintf("127.0.0.%d", 200+i)), "/"); err != nil {
			t.Fatalf("new client with the cap full of idle connections: %v", err)
		}
		took := time.Since(start)
		t.Logf("new client %d answered in %s with the cap (%d) full", i+1, took, clients)
		if took > time.Second {
			t.Errorf("new client %d answered after %s, want within 1s", i+1, took)
		}
	}
	if l.Evicted() != 3 {
		t.Errorf("%d idle connections closed, want 3", l.Evicted())
	}
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("the request in flight: %v", err)
	}
}
