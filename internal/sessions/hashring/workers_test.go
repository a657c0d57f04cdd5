package hashring

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestWorkersRunConcurrentlyAndCloseWaits: a function that blocks does not
// hold up the next one (a batch's requests must not wait for each other),
// and close returns only once every function ran to its end.
func TestWorkersRunConcurrentlyAndCloseWaits(t *testing.T) {
	w := newWorkers()
	release := make(chan struct{})
	var ended atomic.Int32
	w.Go(func() {
		<-release
		ended.Add(1)
	})
	second := make(chan struct{})
	w.Go(func() {
		close(second)
		ended.Add(1)
	})
	select {
	case <-second:
	case <-time.After(20 * time.Second):
		t.Fatal("a function waited for a blocked one")
	}
	for i := 0; i < 100; i++ {
		w.Go(func() { ended.Add(1) })
	}
	closed := make(chan struct{})
	go func() {
		w.close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("close returned while a function still ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	if n := ended.Load(); n != 102 {
		t.Fatalf("%d functions ended by close, want 102", n)
	}
}
