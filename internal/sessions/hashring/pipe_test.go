package hashring

import (
	"bytes"
	"testing"
)

// TestPipeTakesBoundedBatches: a batch holds at most maxBatch requests and
// at most the pipe's byte bound (a larger request goes alone), in queue
// order, and no more than maxInFlight batches are taken at once.
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
	add(40, 40, 40, 500, 10)
	if got := sizes(p.takeLocked()); len(got) != 2 || got[0] != 40 || got[1] != 40 {
		t.Fatalf("first batch %v, want [40 40]", got)
	}
	if got := sizes(p.takeLocked()); len(got) != 1 || got[0] != 40 {
		t.Fatalf("second batch %v, want [40] (the next request would pass the bound)", got)
	}
	if p.inFlight != 2 {
		t.Fatalf("%d batches in flight, want 2", p.inFlight)
	}
	p.inFlight = maxInFlight // the pipe is full
	if b := p.takeLocked(); b != nil {
		t.Fatalf("a batch beyond maxInFlight: %v", sizes(b))
	}
	p.inFlight = 0
	if got := sizes(p.takeLocked()); len(got) != 1 || got[0] != 500 {
		t.Fatalf("third batch %v, want the large request alone", got)
	}
	if got := sizes(p.takeLocked()); len(got) != 1 || got[0] != 10 {
		t.Fatalf("fourth batch %v, want [10]", got)
	}
	p.inFlight = 0
	if b := p.takeLocked(); b != nil || p.inFlight != 0 {
		t.Fatalf("a batch of an empty queue: %v", b)
	}
	for i := 0; i < maxBatch+5; i++ {
		add(1)
	}
	if got := p.takeLocked(); len(got) != maxBatch {
		t.Fatalf("batch of %d requests, want maxBatch %d", len(got), maxBatch)
	}
	if got := p.takeLocked(); len(got) != 5 || len(p.queue) != 0 {
		t.Fatalf("rest: %d requests, %d left", len(got), len(p.queue))
	}
}
