package hashring

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// TestPipeTakesBoundedBatches: a batch holds at most maxBatch requests and
// at most the pipe's byte bound (a larger request goes alone), in queue
// order; a second batch goes beside one in flight only once that one has
// waited laneAfter, and never more than maxInFlight.
func TestPipeTakesBoundedBatches(t *testing.T) {
	p := &pipe{maxBytes: 100}
	add := func(sizes ...int) {
		for _, n := range sizes {
			p.queue = append(p.queue, &pendingCall{body: bytes.Repeat([]byte{byte(len(p.queue))}, n)})
		}
	}
	sizes := func(batch []*pendingCall) []int {
		var out []int
		for _, pc := range batch {
			out = append(out, len(pc.body))
		}
		return out
	}
	now := time.Unix(1000, 0)
	add(40, 40, 40, 500, 10)
	if got := sizes(p.takeLocked(now)); len(got) != 2 || got[0] != 40 || got[1] != 40 {
		t.Fatalf("first batch %v, want [40 40]", got)
	}
	if b := p.takeLocked(now.Add(laneAfter - time.Nanosecond)); b != nil {
		t.Fatalf("a second batch beside one in flight for less than laneAfter: %v", sizes(b))
	}
	now = now.Add(laneAfter)
	if got := sizes(p.takeLocked(now)); len(got) != 1 || got[0] != 40 {
		t.Fatalf("second batch %v, want [40] (the next request would pass the bound)", got)
	}
	if p.inFlight != 2 {
		t.Fatalf("%d batches in flight, want 2", p.inFlight)
	}
	p.inFlight = maxInFlight // the pipe is full
	if b := p.takeLocked(now.Add(time.Hour)); b != nil {
		t.Fatalf("a batch beyond maxInFlight: %v", sizes(b))
	}
	p.inFlight = 0
	if got := sizes(p.takeLocked(now)); len(got) != 1 || got[0] != 500 {
		t.Fatalf("third batch %v, want the large request alone", got)
	}
	p.inFlight = 0
	if got := sizes(p.takeLocked(now)); len(got) != 1 || got[0] != 10 {
		t.Fatalf("fourth batch %v, want [10]", got)
	}
	p.inFlight = 0
	if b := p.takeLocked(now); b != nil || p.inFlight != 0 {
		t.Fatalf("a batch of an empty queue: %v", b)
	}
	for i := 0; i < maxBatch+5; i++ {
		add(1)
	}
	if got := p.takeLocked(now); len(got) != maxBatch {
		t.Fatalf("batch of %d requests, want maxBatch %d", len(got), maxBatch)
	}
	p.inFlight = 0
	if got := p.takeLocked(now); len(got) != 5 || len(p.queue) != 0 {
		t.Fatalf("rest: %d requests, %d left", len(got), len(p.queue))
	}
}

// TestStuckBatchOpensALane: while a batch is in flight, requests queue
// and go together in the next batch; a request queued behind a batch that
// gets no answer goes in a batch of its own once that batch has waited
// laneAfter, instead of waiting for it; Close waits for both.
func TestStuckBatchOpensALane(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	ps := newPipes(1<<20, func(_ string, batch []*pendingCall) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-release // the stuck batch
		}
		for _, pc := range batch {
			pc.resp = &peerResponse{}
			close(pc.done)
		}
	}, func(f func()) { go f() })
	call := func() *pendingCall {
		pc := &pendingCall{body: []byte("{}"), done: make(chan struct{})}
		go ps.send("peer", false, pc)
		return pc
	}
	stuck := call()
	for { // until the first batch is in flight
		mu.Lock()
		n := len(sizes)
		mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var behind []*pendingCall
	for i := 0; i < 5; i++ {
		behind = append(behind, call())
	}
	for _, pc := range behind {
		select {
		case <-pc.done:
		case <-time.After(20 * time.Second):
			t.Fatal("a request queued behind a stuck batch waited for it")
		}
	}
	select {
	case <-stuck.done:
		t.Fatal("the stuck batch answered before it was released")
	default:
	}
	close(release)
	<-stuck.done
	ps.close()
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range sizes[1:] {
		total += n
	}
	if total != len(behind) || len(sizes) > 1+len(behind) {
		t.Fatalf("batches %v for 1 stuck and %d queued requests", sizes, len(behind))
	}
	t.Logf("batches: %v", sizes)
}
