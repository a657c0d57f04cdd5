// Package connlimit caps the connections a listener hands to a server: in
// total, and per client address, so that one client holding many idle
// connections can exhaust neither the process's file descriptors nor the
// server's patience for everybody else.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Listener wraps a net.Listener. Beyond MaxTotal open connections Accept
// waits until one closes (the kernel's backlog queues new clients
// meanwhile), as a process out of file descriptors would, but without
// failing accept calls. A connection from an address that already holds
// MaxPerClient is closed at once, so that one client cannot take every
// slot; Accept never waits for that client's own connections to close.
type Listener struct {
	net.Listener
	maxPerClient int
	slots        chan struct{} // nil: no total limit

	mu       sync.Mutex
	byClient map[netip.Addr]int

	refused   atomic.Int64
	closed    chan struct{}
	closeOnce sync.Once
}

// New caps ln at maxTotal connections in all and maxPerClient per client
// address; zero (or less) means no cap.
func New(ln net.Listener, maxTotal, maxPerClient int) *Listener {
	l := &Listener{Listener: ln, maxPerClient: maxPerClient, byClient: map[netip.Addr]int{}, closed: make(chan struct{})}
	if maxTotal > 0 {
		l.slots = make(chan struct{}, maxTotal)
	}
	return l
}

// Refused counts the connections closed at once for their client's cap.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Open returns how many connections from addr are open.
func (l *Listener) Open(addr netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byClient[addr.Unmap()]
}

func (l *Listener) Accept() (net.Conn, error) {
	for {
		if l.slots != nil {
			select {
			case l.slots <- struct{}{}:
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.release()
			return nil, err
		}
		addr := clientAddr(c)
		if !l.admit(addr) {
			l.refused.Add(1)
			c.Close()
			l.release()
			continue
		}
		return &conn{Conn: c, l: l, addr: addr}, nil
	}
}

// Close stops Accept, also one waiting for a free slot.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (l *Listener) admit(addr netip.Addr) bool {
	if l.maxPerClient <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byClient[addr] >= l.maxPerClient {
		return false
	}
	l.byClient[addr]++
	return true
}

func (l *Listener) release() {
	if l.slots != nil {
		<-l.slots
	}
}

func (l *Listener) forget(addr netip.Addr) {
	if l.maxPerClient > 0 {
		l.mu.Lock()
		if n := l.byClient[addr] - 1; n > 0 {
			l.byClient[addr] = n
		} else {
			delete(l.byClient, addr)
		}
		l.mu.Unlock()
	}
	l.release()
}

// clientAddr is the connection's remote IP (IPv4 in IPv6 unmapped); the
// zero Addr for a remote address that is not IP (one bucket for all).
func clientAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// conn gives its slots back once, when it is closed.
type conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.forget(c.addr) })
	return err
}
