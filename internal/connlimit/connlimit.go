// Package connlimit caps the connections a listener hands to a server: in
// total, and per client, so that one client holding many idle connections
// can exhaust neither the process's file descriptors nor the server's
// patience for everybody else. At the total cap, a connection idle
// between requests (keep-alive) is closed to make room for a new one:
// see Listener.ConnState.
package connlimit

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Listener wraps a net.Listener. A connection from a client that already
// holds MaxPerClient is closed at once, so that one client cannot take
// every slot. Beyond MaxTotal open connections, a new connection (the
// Listener takes at most one out of the kernel's backlog) gets the slot of
// the longest-idle keep-alive connection, which is closed; while no
// connection is idle, it waits until one closes or becomes idle, as a
// process out of file descriptors would, but without failing accept calls.
// Idle is what the http.Server reports to ConnState, which must be set as
// the server's ConnState hook for idle connections to be closed first.
type Listener struct {
	net.Listener
	maxPerClient int
	slots        chan struct{} // nil: no total limit

	mu       sync.Mutex
	byClient map[netip.Addr]int
	// idle holds the connections without a request in flight, the
	// longest-idle first (*conn values).
	idle list.List
	// becameIdle wakes an Accept that waits for a slot.
	becameIdle chan struct{}

	refused   atomic.Int64
	evicted   atomic.Int64
	closed    chan struct{}
	closeOnce sync.Once
}

// New caps ln at maxTotal connections in all and maxPerClient per client
// (ClientKey); zero (or less) means no cap.
func New(ln net.Listener, maxTotal, maxPerClient int) *Listener {
	l := &Listener{Listener: ln, maxPerClient: maxPerClient, byClient: map[netip.Addr]int{},
		becameIdle: make(chan struct{}, 1), closed: make(chan struct{})}
	if maxTotal > 0 {
		l.slots = make(chan struct{}, maxTotal)
	}
	return l
}

// Refused counts the connections closed at once for their client's cap.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Evicted counts the idle connections closed to make room for new ones.
func (l *Listener) Evicted() int64 { return l.evicted.Load() }

// Open returns how many connections from addr's client (ClientKey) are
// open.
func (l *Listener) Open(addr netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byClient[ClientKey(addr)]
}

func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := clientAddr(c)
		if !l.admit(addr) {
			l.refused.Add(1)
			c.Close()
			continue
		}
		if err := l.acquire(); err != nil {
			c.Close()
			l.unadmit(addr)
			return nil, err
		}
		return &conn{Conn: c, l: l, addr: addr}, nil
	}
}

// acquire takes a slot: a free one, else that of the longest-idle
// connection (closed here; its Close gives its slot back), else it waits
// for a connection to close or become idle.
func (l *Listener) acquire() error {
	if l.slots == nil {
		return nil
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
		if victim := l.takeIdle(); victim != nil {
			l.evicted.Add(1)
			// Close returns once the slot is back (a concurrent Close by
			// the server finishes first, as sync.Once waits for it).
			victim.Close()
			continue
		}
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.becameIdle:
		case <-l.closed:
			return net.ErrClosed
		}
	}
}

// takeIdle removes the longest-idle connection from the idle list and
// returns it; nil when none is idle.
func (l *Listener) takeIdle() *conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.idle.Front()
	if e == nil {
		return nil
	}
	c := l.idle.Remove(e).(*conn)
	c.idleAt = nil
	return c
}

// ConnState is the http.Server's ConnState hook: it keeps the list of
// idle connections (between requests of a keep-alive connection), which
// are closed first when the total cap is reached. A request that arrives
// on an idle connection just as it is closed fails as it would at the
// server's IdleTimeout; HTTP clients retry such requests on a new
// connection where it is safe.
func (l *Listener) ConnState(nc net.Conn, state http.ConnState) {
	c := unwrap(nc)
	if c == nil || c.l != l {
		return
	}
	l.mu.Lock()
	if c.idleAt != nil {
		l.idle.Remove(c.idleAt)
		c.idleAt = nil
	}
	if state == http.StateIdle && !c.closed {
		c.idleAt = l.idle.PushBack(c)
	}
	l.mu.Unlock()
	if state == http.StateIdle {
		select {
		case l.becameIdle <- struct{}{}:
		default:
		}
	}
}

// unwrap finds the Listener's conn under the connection a server reports
// (a *tls.Conn around it, with TLS).
func unwrap(nc net.Conn) *conn {
	for range 8 {
		switch c := nc.(type) {
		case *conn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
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

func (l *Listener) unadmit(addr netip.Addr) {
	if l.maxPerClient > 0 {
		l.mu.Lock()
		if n := l.byClient[addr] - 1; n > 0 {
			l.byClient[addr] = n
		} else {
			delete(l.byClient, addr)
		}
		l.mu.Unlock()
	}
}

func (l *Listener) forget(c *conn) {
	l.mu.Lock()
	c.closed = true
	if c.idleAt != nil {
		l.idle.Remove(c.idleAt)
		c.idleAt = nil
	}
	l.mu.Unlock()
	l.unadmit(c.addr)
	if l.slots != nil {
		<-l.slots
	}
}

// ClientKey is the client an address counts as: an IPv4 address itself
// (also written IPv4-mapped IPv6), an IPv6 address its /64 prefix (one
// subscriber's network; a host picks addresses in it freely). The zero
// Addr stays zero.
func ClientKey(addr netip.Addr) netip.Addr {
	addr = addr.Unmap()
	if addr.Is6() {
		if p, err := addr.WithZone("").Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return addr
}

// ClientOf is the ClientKey of a remote address in host:port form (as
// net.Conn.RemoteAddr().String() and http.Request.RemoteAddr give it);
// the zero Addr for one that is not IP (one bucket for all).
func ClientOf(remoteAddr string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ClientKey(ap.Addr())
	}
	return netip.Addr{}
}

func clientAddr(c net.Conn) netip.Addr { return ClientOf(c.RemoteAddr().String()) }

// conn gives its slots back once, when it is closed.
type conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr
	once sync.Once
	// idleAt is its element of l.idle while idle (guarded by l.mu).
	idleAt *list.Element
	// closed is set once Close gave the slots back (guarded by l.mu).
	closed bool
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.forget(c) })
	return err
}
