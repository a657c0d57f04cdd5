// Package connlimit caps the connections a listener hands to a server: in
// total, and per client, so that one client holding many idle connections
// can exhaust neither the process's file descriptors nor the server's
// patience for everybody else. At the total cap, a connection without a
// request in flight (idle between requests of a keep-alive connection, or
// silent since it was accepted) is closed to make room for a new one: see
// Listener.ConnState.
package connlimit

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// SilentGrace is how long a connection may stay silent after it was
// accepted (no complete request header yet; a TLS handshake counts as
// silence) before it may be closed for a new connection at the total cap.
// A client sends its first request within a few round trips of
// connecting; one that connects and says nothing holds a slot as an idle
// keep-alive connection does, and the server's ReadHeaderTimeout would
// free it only after seconds.
const SilentGrace = 500 * time.Millisecond

// IdleSettle is how long a connection must have been idle before it may
// be closed for a new one. An HTTP/2 connection reports itself idle when
// its last stream ends, possibly before the last frames of the answer
// are written: closing it at once would cut that answer off.
const IdleSettle = 100 * time.Millisecond

// Listener wraps a net.Listener. A connection from a client that already
// holds MaxPerClient is closed at once, so that one client cannot take
// every slot. Beyond MaxTotal open connections, a new connection (the
// Listener takes at most one out of the kernel's backlog) gets the slot of
// the longest-idle keep-alive connection (idle for IdleSettle at least),
// else of the longest-silent connection accepted more than SilentGrace ago
// that has not sent a request, which is closed; while there is neither, it waits until a
// connection closes, becomes idle or has been silent long enough, as a
// process out of file descriptors would, but without failing accept calls.
// Idle and silent are what the http.Server reports to ConnState (StateIdle,
// StateNew), which must be set as the server's ConnState hook for such
// connections to be closed first; without it none is.
type Listener struct {
	net.Listener
	maxPerClient int
	slots        chan struct{} // nil: no total limit

	mu       sync.Mutex
	byClient map[netip.Addr]int
	// idle holds the keep-alive connections between requests, the
	// longest-idle first (*conn values).
	idle list.List
	// silent holds the connections that have sent no request yet, the
	// earliest accepted first (*conn values).
	silent list.List
	// becameIdle wakes an Accept that waits for a slot.
	becameIdle chan struct{}
	// silentGrace is SilentGrace, shorter in tests.
	silentGrace time.Duration
	// idleSettle is IdleSettle.
	idleSettle time.Duration

	refused   atomic.Int64
	evicted   atomic.Int64
	closed    chan struct{}
	closeOnce sync.Once
}

// New caps ln at maxTotal connections in all and maxPerClient per client
// (ClientKey); zero (or less) means no cap.
func New(ln net.Listener, maxTotal, maxPerClient int) *Listener {
	l := &Listener{Listener: ln, maxPerClient: maxPerClient, byClient: map[netip.Addr]int{},
		becameIdle: make(chan struct{}, 1), closed: make(chan struct{}), silentGrace: SilentGrace, idleSettle: IdleSettle}
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

// acquire takes a slot: a free one, else that of a connection without a
// request in flight (takeVictim; closed here, its Close gives its slot
// back), else it waits for a connection to close, or to have been idle
// or silent long enough.
func (l *Listener) acquire() error {
	if l.slots == nil {
		return nil
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
		victim, wait := l.takeVictim(time.Now())
		if victim != nil {
			l.evicted.Add(1)
			// Close returns once the slot is back (a concurrent Close by
			// the server finishes first, as sync.Once waits for it).
			victim.Close()
			continue
		}
		var silentLongEnough <-chan time.Time
		if wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			silentLongEnough = timer.C
		}
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.becameIdle:
		case <-silentLongEnough:
		case <-l.closed:
			return net.ErrClosed
		}
	}
}

// takeVictim removes the connection to close for a new one from its list
// and returns it: the longest-idle one if it has been idle for the
// settle time, else the longest-silent one if it was accepted at least the
// grace before now. With neither, it returns how long until one of them
// is (0: none is idle or silent).
func (l *Listener) takeVictim(now time.Time) (*conn, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	for _, q := range []struct {
		list  *list.List
		after time.Duration
	}{{&l.idle, l.idleSettle}, {&l.silent, l.silentGrace}} {
		e := q.list.Front()
		if e == nil {
			continue
		}
		c := e.Value.(*conn)
		if w := c.listedAt.Add(q.after).Sub(now); w > 0 {
			if wait == 0 || w < wait {
				wait = w
			}
			continue
		}
		q.list.Remove(e)
		c.listed, c.list = nil, nil
		return c, 0
	}
	return nil, wait
}

// ConnState is the http.Server's ConnState hook: it keeps the lists of
// idle connections (between requests of a keep-alive connection) and of
// silent ones (accepted, no request yet: StateNew, also during a TLS
// handshake), which are closed first when the total cap is reached. A
// request that arrives on such a connection just as it is closed fails as
// it would at the server's IdleTimeout or ReadHeaderTimeout; HTTP clients
// retry such requests on a new connection where it is safe.
func (l *Listener) ConnState(nc net.Conn, state http.ConnState) {
	c := unwrap(nc)
	if c == nil || c.l != l {
		return
	}
	l.mu.Lock()
	if c.listed != nil {
		c.list.Remove(c.listed)
		c.listed, c.list = nil, nil
	}
	if !c.closed {
		switch state {
		case http.StateIdle:
			c.list = &l.idle
		case http.StateNew:
			c.list = &l.silent
		}
		if c.list != nil {
			c.listed, c.listedAt = c.list.PushBack(c), time.Now()
		}
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
	if c.listed != nil {
		c.list.Remove(c.listed)
		c.listed, c.list = nil, nil
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
	// listed is its element of list, l.idle or l.silent, while it is
	// idle or silent, since listedAt (all guarded by l.mu).
	listed   *list.Element
	list     *list.List
	listedAt time.Time
	// closed is set once Close gave the slots back (guarded by l.mu).
	closed bool
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.forget(c) })
	return err
}
