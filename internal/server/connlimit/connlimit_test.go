package connlimit

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func dialFrom(t *testing.T, src string, addr net.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptAsync accepts in the background; the channel gets the connection,
// or is closed when Accept fails.
func acceptAsync(l *Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(ch)
			return
		}
		ch <- c
	}()
	return ch
}

func TestPerClientCapClosesAtOnce(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 0, 2)
	defer l.Close()
	a1, a2, a3 := dialFrom(t, "127.0.0.1", l.Addr()), dialFrom(t, "127.0.0.1", l.Addr()), dialFrom(t, "127.0.0.1", l.Addr())
	_ = a1
	_ = a2
	b := dialFrom(t, "127.0.0.2", l.Addr())
	var got []net.Conn
	for i := 0; i < 3; i++ { // the third from 127.0.0.1 is refused and skipped
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c)
	}
	if l.Refused() != 1 {
		t.Fatalf("refused %d, want 1", l.Refused())
	}
	a3.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := a3.Read(make([]byte, 1)); err == nil {
		t.Fatal("the third connection of one client was not closed")
	}
	if n := l.Open(netip.MustParseAddr("127.0.0.1")); n != 2 {
		t.Fatalf("open from 127.0.0.1: %d", n)
	}
	// Closing one frees its slot (twice is harmless).
	got[0].Close()
	got[0].Close()
	if n := l.Open(netip.MustParseAddr("127.0.0.1")); n != 1 {
		t.Fatalf("open from 127.0.0.1 after a close: %d", n)
	}
	_ = b
}

func TestTotalCapWaits(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 1, 0)
	dialFrom(t, "127.0.0.1", l.Addr())
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	dialFrom(t, "127.0.0.2", l.Addr())
	next := acceptAsync(l)
	select {
	case c := <-next:
		t.Fatalf("a second connection was handed out at a total cap of 1: %v", c)
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	if c := <-next; c == nil {
		t.Fatal("no connection after a slot was freed")
	} else {
		c.Close()
	}
	// Close ends an Accept that waits for a slot.
	next = acceptAsync(l)
	time.Sleep(50 * time.Millisecond)
	l.Close()
	if c, ok := <-next; ok {
		t.Fatalf("Accept after Close: %v", c)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}
