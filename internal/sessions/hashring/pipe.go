package hashring

import (
	"context"
	"sync"
)

// Group commit of peer requests. Each peer has a pipe: a request that
// finds fewer than maxInFlight batches in flight to its peer is sent at
// once, by its caller, with whatever else is queued (so an idle pipe adds
// no latency: there is no timer); one that finds the pipe busy queues, and
// goes with the next batch, which the sender of the batch that finishes
// first starts. Under load, many requests share one sealed message, one
// HTTP round trip and one replay check, which is what made a forwarded
// poll cost several times a local one.

// maxInFlight is how many batches may be in flight in one pipe at once.
// An owner serving a batch copies each change to its backup before it
// answers, so a batch takes two round trips, and a slow request holds up
// its whole batch: with 2, test/replicas' crash phase saw peers silent for
// seconds while requests queued behind full pipes (503s from peer
// timeouts, where main before batching had none); with 8, none in the
// same run conditions.
const maxInFlight = 8

// Each peer has two pipes: one for session operations, which the receiver
// may serve by calling other replicas in turn (a copy to the backup, a
// forward, a take), and one for leaf operations, which the receiver
// serves from its own store alone (copies, handovers, transfers,
// membership). A batch is answered when all its requests are, so if the
// copies an owner sends while serving a batch queued behind that same
// kind of batch, two owners copying to each other could each fill its
// pipe to the other with batches that wait for the other's copies: a
// deadlock until the peer timeout. Leaf batches wait for nothing, so they
// always drain.
func leafOp(op string) bool {
	switch op {
	case opReplicate, opHandover, opDropCopy, opTransfer, opJoin, opLeave:
		return true
	}
	return false
}

// pendingCall is a request waiting for its answer.
type pendingCall struct {
	body []byte // the encoded peerRequest
	resp *peerResponse
	err  error
	done chan struct{} // closed once resp or err is set
}

type pipe struct {
	maxBytes int64 // of a batch's requests together

	mu       sync.Mutex
	queue    []*pendingCall
	inFlight int
}

// pipes are the pipes of a Store, two per peer URL (leafOp).
type pipes struct {
	maxBytes int64

	mu sync.Mutex
	m  map[pipeKey]*pipe
	// wg counts the goroutines that send batches queued behind others.
	wg sync.WaitGroup
}

type pipeKey struct {
	peer string
	leaf bool
}

func newPipes(maxBytes int64) *pipes { return &pipes{maxBytes: maxBytes, m: map[pipeKey]*pipe{}} }

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

// close waits for the batches in flight (each ends within the peer
// timeout).
func (ps *pipes) close() { ps.wg.Wait() }

// send queues pc for peer (in its leaf pipe if leaf) and, if the pipe has
// room, sends the queue in this goroutine. The caller then waits for
// pc.done.
func (ps *pipes) send(s *Store, peer string, leaf bool, pc *pendingCall) {
	p := ps.get(pipeKey{peer, leaf})
	p.mu.Lock()
	p.queue = append(p.queue, pc)
	batch := p.takeLocked()
	p.mu.Unlock()
	if batch != nil {
		ps.run(s, peer, p, batch)
	}
}

// takeLocked takes the next batch off the queue if another batch may be
// in flight: at most maxBatch requests, of at most maxPeerMessage bytes
// together (a larger request goes alone).
func (p *pipe) takeLocked() []*pendingCall {
	if p.inFlight >= maxInFlight || len(p.queue) == 0 {
		return nil
	}
	p.inFlight++
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

// run sends batch and delivers the answers; then, if requests queued
// meanwhile and no other sender took them, sends those from a goroutine of
// its own, so that this caller gets its answer now.
func (ps *pipes) run(s *Store, peer string, p *pipe, batch []*pendingCall) {
	s.sendBatch(peer, batch)
	p.mu.Lock()
	p.inFlight--
	next := p.takeLocked()
	p.mu.Unlock()
	if next == nil {
		return
	}
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		for next != nil {
			s.sendBatch(peer, next)
			p.mu.Lock()
			p.inFlight--
			next = p.takeLocked()
			p.mu.Unlock()
		}
	}()
}

// sendBatch sends one batch and sets every call's answer or error. It is
// bounded by the peer client's timeout, not by any one caller's context:
// the batch serves them all.
func (s *Store) sendBatch(peer string, batch []*pendingCall) {
	bodies := make([][]byte, len(batch))
	for i, pc := range batch {
		bodies[i] = pc.body
	}
	resps, err := s.roundTrip(context.Background(), s.client, peer, bodies)
	for i, pc := range batch {
		if err != nil {
			pc.err = err
		} else {
			pc.resp = resps[i]
		}
		close(pc.done)
	}
}
