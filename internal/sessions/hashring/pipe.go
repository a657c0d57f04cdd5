package hashring

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit of peer requests. Each peer has a pipe: a request that
// finds no batch in flight to its peer is sent at once, by its caller,
// with whatever else is queued (so an idle pipe adds no latency: there is
// no timer on that path); one that finds a batch in flight queues, and
// goes with the next batch, which the sender of the batch in flight
// starts when it is answered. Under load, many requests share one sealed
// message, one HTTP round trip and one replay check, which is what made a
// forwarded poll cost several times a local one.
//
// One batch in flight makes batches as large as the load allows (with
// eight in flight, pollbench's two-replica figure was about a third
// lower: many small batches). But a batch is answered when all its
// requests are, and a request may be slow at the peer (a take that waits
// for a third replica, a copy to a backup that hangs): then the requests
// queued behind it would wait for the slowest of them. So a batch that is
// not answered within laneAfter counts as stuck, and another batch may
// go beside it, up to maxInFlight: test/replicas' crash phase saw peers
// silent for seconds with at most two batches in flight and no such
// rule (503s from peer timeouts), and none with eight.

// maxInFlight is how many batches may be in flight in one pipe at once.
const maxInFlight = 8

// laneAfter is how long the newest batch in flight must have waited for
// its answer before another batch may go beside it. A pipe's batch is
// answered in well under a millisecond on an idle machine and in a few
// under pollbench's full load on one shared core.
const laneAfter = 10 * time.Millisecond

// Each peer has two pipes: one for session operations, which the receiver
// may serve by calling other replicas in turn (a copy to the backup, a
// forward, a take), and one for leaf operations, which the receiver
// serves from its own store alone (copies, handovers, transfers,
// membership). A batch is answered when all its requests are, so if the
// copies an owner sends while serving a batch queued behind that same
// kind of batch, two owners copying to each other could each fill its
// pipe to the other with batches that wait for the other's copies: a
// deadlock until the peer timeout. Leaf batches wait for nothing, so they
// always drain. On a stream a batch counts as answered at its ack, which
// waits for none of its requests that wait for another replica
// (stream.go), so there leaf requests share the session pipe (call).
func leafOp(op string) bool {
	switch op {
	case opReplicate, opHandover, opDropCopy, opTransfer, opExport, opJoin, opLeave:
		return true
	}
	return false
}

// bodiesOf returns the encoded requests of batch.
func bodiesOf(batch []*pendingCall) [][]byte {
	bodies := make([][]byte, len(batch))
	for i, pc := range batch {
		bodies[i] = pc.body
	}
	return bodies
}

// pendingCall is a request waiting for its answer.
type pendingCall struct {
	body []byte // the encoded peerRequest
	leaf bool   // leafOp
	resp *peerResponse
	err  error
	done chan struct{} // closed once resp or err is set
}

type pipe struct {
	maxBytes int64 // of a batch's requests together

	mu       sync.Mutex
	queue    []*pendingCall
	inFlight int
	lastSent time.Time   // when the newest batch in flight went
	timer    *time.Timer // set while requests wait for a lane to open
}

// pipes are the pipes of a Store, two per peer URL (leafOp).
type pipes struct {
	maxBytes int64
	// sendBatch sends a batch and sets every call's answer or error
	// (Store.sendBatch).
	sendBatch func(peer string, batch []*pendingCall)
	// spawn runs a function on another goroutine (Store.workers.Go).
	spawn func(func())

	mu     sync.Mutex
	m      map[pipeKey]*pipe
	closed atomic.Bool
	// wg counts the goroutines that send batches queued behind others,
	// and the lane timers set.
	wg sync.WaitGroup

	// messages and requests count what was sent: their ratio is the
	// mean batch size (hashring_peer_*_sent_total).
	messages, requests atomic.Uint64
}

type pipeKey struct {
	peer string
	leaf bool
}

func newPipes(maxBytes int64, sendBatch func(peer string, batch []*pendingCall), spawn func(func())) *pipes {
	return &pipes{maxBytes: maxBytes, sendBatch: sendBatch, spawn: spawn, m: map[pipeKey]*pipe{}}
}

func (ps *pipes) get(k pipeKey) *pipe {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[k]
	if p == nil {
		// Two pipes per peer URL ever called: a few bytes each, and the
		// peer URLs of a cluster are few.
		p = &pipe{maxBytes: ps.maxBytes}
		ps.m[k] = p
	}
	return p
}

// close stops the lane timers and waits for the batches in flight (each
// ends within the peer timeout).
func (ps *pipes) close() {
	ps.closed.Store(true)
	ps.mu.Lock()
	all := make([]*pipe, 0, len(ps.m))
	for _, p := range ps.m {
		all = append(all, p)
	}
	ps.mu.Unlock()
	// A timer set before closed was stored is seen here (armLocked sets
	// it under p.mu); none is set after.
	for _, p := range all {
		p.mu.Lock()
		if p.timer != nil && p.timer.Stop() {
			ps.wg.Done()
		}
		p.timer = nil
		p.mu.Unlock()
	}
	ps.wg.Wait()
}

// send queues pc for peer (in its leaf pipe if leaf) and, if the pipe has
// room, sends the queue in this goroutine. The caller then waits for
// pc.done.
func (ps *pipes) send(peer string, leaf bool, pc *pendingCall) {
	p := ps.get(pipeKey{peer, leaf})
	p.mu.Lock()
	p.queue = append(p.queue, pc)
	batch := ps.nextLocked(peer, p)
	p.mu.Unlock()
	if batch != nil {
		ps.run(peer, p, batch)
	}
}

// takeLocked takes the next batch off the queue if it may go now: no
// batch is in flight, or the newest one has waited laneAfter and fewer
// than maxInFlight are. A batch holds at most maxBatch requests, of at
// most maxBytes together (a larger request goes alone).
func (p *pipe) takeLocked(now time.Time) []*pendingCall {
	if len(p.queue) == 0 || p.inFlight >= maxInFlight || p.inFlight > 0 && now.Sub(p.lastSent) < laneAfter {
		return nil
	}
	p.inFlight++
	p.lastSent = now
	n, size := 1, int64(len(p.queue[0].body))
	for n < len(p.queue) && n < maxBatch && size+int64(len(p.queue[n].body)) <= p.maxBytes {
		size += int64(len(p.queue[n].body))
		n++
	}
	batch := p.queue[:n:n]
	if n == len(p.queue) {
		p.queue = nil
	} else {
		p.queue = p.queue[n:]
	}
	return batch
}

// nextLocked takes the batch that may go now, if any; else it makes sure
// the queue goes when a lane opens (armLocked).
func (ps *pipes) nextLocked(peer string, p *pipe) []*pendingCall {
	batch := p.takeLocked(time.Now())
	if batch == nil {
		ps.armLocked(peer, p)
	}
	return batch
}

// armLocked makes sure that requests left queued go when a lane opens,
// should the batch in flight stay unanswered until then.
func (ps *pipes) armLocked(peer string, p *pipe) {
	if p.timer != nil || len(p.queue) == 0 || p.inFlight >= maxInFlight {
		return // set already, nothing waits, or only an answer frees a lane
	}
	if ps.closed.Load() {
		return
	}
	ps.wg.Add(1)
	p.timer = time.AfterFunc(laneAfter-time.Since(p.lastSent), func() {
		defer ps.wg.Done()
		p.mu.Lock()
		p.timer = nil
		batch := ps.nextLocked(peer, p)
		p.mu.Unlock()
		if batch != nil {
			ps.drain(peer, p, batch)
		}
	})
}

// run sends batch and delivers the answers; then, if requests queued
// meanwhile and no other sender took them, sends those from a goroutine of
// its own, so that this caller gets its answer now.
func (ps *pipes) run(peer string, p *pipe, batch []*pendingCall) {
	ps.sendBatch(peer, batch)
	next := ps.done(peer, p)
	if next == nil {
		return
	}
	ps.wg.Add(1)
	ps.spawn(func() {
		defer ps.wg.Done()
		ps.drain(peer, p, next)
	})
}

// drain sends batch, then the batches queued meanwhile, until none is.
func (ps *pipes) drain(peer string, p *pipe, batch []*pendingCall) {
	for batch != nil {
		ps.sendBatch(peer, batch)
		batch = ps.done(peer, p)
	}
}

// done notes that a batch of p was answered and takes the next one.
func (ps *pipes) done(peer string, p *pipe) []*pendingCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	return ps.nextLocked(peer, p)
}

// sendBatch sends one batch and sets every call's answer or error, or
// for a stream, the answers of the requests the peer served at once (the
// others are set when they come). It is bounded by the peer timeout, not
// by any one caller's context: the batch serves them all.
func (s *Store) sendBatch(peer string, batch []*pendingCall) {
	if st := s.senders.get(peer); st != nil && st.send(s, batch) {
		return
	}
	// A batch made for a stream that closed meanwhile may hold leaf
	// requests and others: as HTTP messages, the leaf ones must not wait
	// for the others (leafOp).
	leaves := 0
	for _, pc := range batch {
		if pc.leaf {
			leaves++
		}
	}
	if leaves == 0 || leaves == len(batch) {
		s.sendMessage(peer, batch)
		return
	}
	leaf, other := make([]*pendingCall, 0, leaves), make([]*pendingCall, 0, len(batch)-leaves)
	for _, pc := range batch {
		if pc.leaf {
			leaf = append(leaf, pc)
		} else {
			other = append(other, pc)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	s.workers.Go(func() {
		defer wg.Done()
		s.sendMessage(peer, leaf)
	})
	s.sendMessage(peer, other)
	wg.Wait()
}

// sendMessage sends batch as one HTTP message.
func (s *Store) sendMessage(peer string, batch []*pendingCall) {
	resps, err := s.roundTrip(context.Background(), s.client, peer, bodiesOf(batch))
	for i, pc := range batch {
		if err != nil {
			pc.err = err
		} else {
			pc.resp = resps[i]
		}
		close(pc.done)
	}
}
