package bridgepipe

import (
	"io"
	"net"
	"testing"
)

// A request written and half-closed on one side arrives whole on the other,
// and the answer comes back, after which Pipe returns.
func TestPipePassesHalfCloses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // the server: reads to EOF, answers, closes
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, _ := io.ReadAll(c)
		_, _ = c.Write(append([]byte("got "), req...))
	}()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	piped := make(chan struct{})
	go func() {
		defer close(piped)
		in, err := pl.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		defer out.Close()
		Pipe(in, out)
	}()
	c, err := net.Dial("tcp", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "got ping" {
		t.Fatalf("answer %q, %v; want \"got ping\"", got, err)
	}
	<-piped
}
