package connlimit

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/certs"
)

// Behind TLS, the cap is full of connections that sent no request: some
// never sent a byte, some finished the TLS handshake and went quiet. To
// the server all are new (StateNew), none idle. A new client is answered
// within a second: silent connections older than the grace are closed
// for it, the longest-silent first, and one younger than the grace is
// not.
func TestSilentConnectionsMakeRoomForNewClients(t *testing.T) {
	const clients = 8
	cert, pool := certs.NewServingPair(t, "connlimit").TLS(t)
	clientTLS := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}

	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, clients, 1)
	l.silentGrace = 300 * time.Millisecond
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ReadHeaderTimeout: time.Minute,
		ConnState:         l.ConnState,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
		ErrorLog:          log.New(io.Discard, "", 0), // the handshakes of closed connections fail
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })

	dial := func(ip string) net.Conn {
		c := dialFrom(t, ip, l.Addr())
		return c
	}
	// Half never send a byte, half finish the handshake and go quiet.
	var conns []net.Conn
	for i := 1; i <= clients; i++ {
		c := dial(fmt.Sprintf("127.0.0.%d", i))
		if i%2 == 0 {
			tc := tls.Client(c, clientTLS)
			if err := tc.Handshake(); err != nil {
				t.Fatalf("handshake %d: %v", i, err)
			}
			c = tc
		}
		conns = append(conns, c)
	}
	waitFor(t, func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.silent.Len() == clients })
	time.Sleep(l.silentGrace)

	get := func(ip string) (time.Duration, error) {
		// No keep-alive: an idle connection would be closed before any
		// silent one, and this client's slot is free again after it.
		tr := &http.Transport{TLSClientConfig: clientTLS, DisableKeepAlives: true,
			DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
		start := time.Now()
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://" + l.Addr().String())
		if err != nil {
			return time.Since(start), err
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err != nil {
			return time.Since(start), err
		}
		return time.Since(start), nil
	}
	var young []net.Conn
	for i := range 3 {
		took, err := get(fmt.Sprintf("127.0.0.%d", 200+i))
		if err != nil {
			t.Fatalf("new client %d with the cap full of silent connections: %v", i+1, err)
		}
		t.Logf("new client %d answered in %s with the cap (%d) full of silent connections", i+1, took, clients)
		if took > time.Second {
			t.Errorf("new client %d answered after %s, want within 1s", i+1, took)
		}
		// A young silent connection takes the slot the new client left:
		// the next new client must close an old one instead.
		waitFor(t, func() bool { return len(l.slots) < clients })
		c := dial(fmt.Sprintf("127.0.0.%d", 100+i))
		young = append(young, c)
		waitFor(t, func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.silent.Len() == clients })
	}
	if l.Evicted() != 3 {
		t.Errorf("%d silent connections closed, want 3", l.Evicted())
	}
	// The longest-silent were closed: the first three; the young ones
	// stay.
	for i, c := range append(conns, young...) {
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		open := err != nil && errors.As(err, &ne) && ne.Timeout()
		if open != (i >= 3) {
			t.Errorf("connection %d (accepted %d.): open %v, want %v (%v)", i+1, i+1, open, i >= 3, err)
		}
	}
}

// A silent connection younger than the grace is not closed: the new
// connection waits for the grace (or a free slot).
func TestSilentGraceIsKept(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 1, 0)
	l.silentGrace = 400 * time.Millisecond
	defer l.Close()
	dialFrom(t, "127.0.0.1", l.Addr())
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	accepted := time.Now()
	l.ConnState(first, http.StateNew)
	dialFrom(t, "127.0.0.2", l.Addr())
	next := acceptAsync(l)
	select {
	case <-next:
		t.Fatalf("a silent connection was closed %s after it was accepted, before the grace", time.Since(accepted))
	case <-time.After(200 * time.Millisecond):
	}
	select {
	case c := <-next:
		if took := time.Since(accepted); took < l.silentGrace {
			t.Errorf("the silent connection was closed after %s, within the grace", took)
		}
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the silent connection was not closed after the grace")
	}
	// Once it sent a request, a connection is not silent any more.
	dialFrom(t, "127.0.0.3", l.Addr())
	second := <-acceptAsync(l)
	l.ConnState(second, http.StateNew)
	l.ConnState(second, http.StateActive)
	dialFrom(t, "127.0.0.4", l.Addr())
	next = acceptAsync(l)
	select {
	case c := <-next:
		t.Fatalf("a connection with a request in flight was closed for %v", c.RemoteAddr())
	case <-time.After(2 * l.silentGrace):
	}
	second.Close()
	if c := <-next; c == nil {
		t.Fatal("no connection after the active one closed")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An HTTP/2 connection is silent to the server until its preface; once
// the HTTP/2 server runs it, it reports the connection active or idle
// itself. A request in flight on it past the grace keeps it: the new
// connection waits until the request ends and the connection is idle, and
// the answer, whose last frames may be written after the connection
// reported itself idle, arrives whole (IdleSettle).
func TestHTTP2ConnectionWithARequestInFlightIsKept(t *testing.T) {
	cert, pool := certs.NewServingPair(t, "connlimit").TLS(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 1, 0)
	l.silentGrace = 100 * time.Millisecond
	release := make(chan struct{})
	inFlight := make(chan struct{})
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				close(inFlight)
				<-release
			}
			io.WriteString(w, r.Proto)
		}),
		ConnState: l.ConnState,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	client := func() *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	get := func(c *http.Client, path string) (string, error) {
		resp, err := c.Get("https://" + l.Addr().String() + path)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	slow := make(chan error, 1)
	go func() {
		proto, err := get(client(), "/slow")
		if err == nil && proto != "HTTP/2.0" {
			err = fmt.Errorf("served over %s, want HTTP/2.0", proto)
		}
		slow <- err
	}()
	<-inFlight
	time.Sleep(3 * l.silentGrace)
	other := make(chan error, 1)
	go func() { _, err := get(client(), "/"); other <- err }()
	select {
	case err := <-other:
		t.Fatalf("a new client was served while the only slot had an HTTP/2 request in flight (%v)", err)
	case err := <-slow:
		t.Fatalf("the HTTP/2 request in flight ended early: %v", err)
	case <-time.After(5 * l.silentGrace):
	}
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("the HTTP/2 request in flight: %v", err)
	}
	if err := <-other; err != nil {
		t.Errorf("the new client after the request ended: %v", err)
	}
}
