package pace

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New[string](1, 2, 2)
	for i := range 2 {
		if d := l.Allow("a", now); d != 0 {
			t.Fatalf("request %d of the burst waited %s", i, d)
		}
	}
	if d := l.Allow("a", now); d <= 0 || d > time.Second {
		t.Fatalf("beyond the burst: wait %s, want (0, 1s]", d)
	}
	if d := l.Allow("b", now); d != 0 {
		t.Fatalf("another key is paced by a's bucket: %s", d)
	}
	if d := l.Allow("a", now.Add(time.Second)); d != 0 {
		t.Fatalf("a second later: wait %s", d)
	}
	// A third key evicts the least recently seen (b); a stays remembered.
	l.Allow("c", now.Add(time.Second))
	if n := l.Len(); n != 2 {
		t.Fatalf("%d keys remembered, want 2", n)
	}
	if d := l.Allow("a", now.Add(time.Second)); d <= 0 {
		t.Fatal("a's bucket was forgotten instead of b's")
	}
	var none *Limiter[string]
	if New[string](0, 5, 5) != nil || none.Allow("x", now) != 0 || none.Len() != 0 {
		t.Fatal("rate 0 must mean no limit")
	}
}
