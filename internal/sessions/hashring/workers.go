package hashring

import (
	"sync"
	"sync/atomic"
	"time"
)

// workers runs functions on goroutines kept for reuse. The requests of a
// peer batch are served concurrently (serveBatch) and a pipe's queued
// batches are sent from a goroutine of their own (pipes.run); a fresh
// goroutine for each grew its stack again to what serving a request
// takes (runtime.newstack and copystack: about 7% of the owner's CPU
// under pollbench), which a kept one has already done.
type workers struct {
	jobs   chan func() // unbuffered: a send succeeds only if a worker waits
	stop   chan struct{}
	closed atomic.Bool
	once   sync.Once
	wg     sync.WaitGroup
}

// workerIdle is how long a worker waits for another function before it
// exits: the pool shrinks back after a burst.
const workerIdle = 10 * time.Second

func newWorkers() *workers {
	return &workers{jobs: make(chan func()), stop: make(chan struct{})}
}

// Go runs f on an idle worker, or on a new one if none is idle; after
// close, in the caller's goroutine (a peer request that arrives while the
// replica stops).
func (w *workers) Go(f func()) {
	if w.closed.Load() {
		f()
		return
	}
	select {
	case w.jobs <- f:
	default:
		w.wg.Add(1)
		go w.loop(f)
	}
}

func (w *workers) loop(f func()) {
	defer w.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-w.jobs:
		case <-idle.C:
			return
		case <-w.stop:
			return
		}
	}
}

// close makes the idle workers exit and waits for every worker: the
// functions running end first.
func (w *workers) close() {
	w.once.Do(func() {
		w.closed.Store(true)
		close(w.stop)
	})
	w.wg.Wait()
}
