// Package pace keeps a token bucket per key (a client address, a user) in
// memory, in a map bounded by a least-recently-used eviction.
package pace

import (
	"container/list"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter is a token bucket per key, for at most max keys; beyond them the
// least recently seen key is forgotten, which gives it a full bucket
// again. Safe for concurrent use. A nil *Limiter allows everything.
type Limiter[K comparable] struct {
	rate  rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	byKey map[K]*list.Element
	lru   list.List // *entry[K], most recently used first
}

type entry[K comparable] struct {
	key K
	lim *rate.Limiter
}

// New allows perSecond per key with burst; nil (no limit) for perSecond
// <= 0.
func New[K comparable](perSecond float64, burst, maxKeys int) *Limiter[K] {
	if perSecond <= 0 {
		return nil
	}
	return &Limiter[K]{rate: rate.Limit(perSecond), burst: max(1, burst), max: max(1, maxKeys), byKey: map[K]*list.Element{}}
}

// Allow takes a token of key's bucket at now; when there is none, it
// returns how long until there is one (and takes nothing).
func (l *Limiter[K]) Allow(key K, now time.Time) time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var lim *rate.Limiter
	if e, ok := l.byKey[key]; ok {
		l.lru.MoveToFront(e)
		lim = e.Value.(*entry[K]).lim
	} else {
		if l.lru.Len() >= l.max {
			oldest := l.lru.Back()
			delete(l.byKey, l.lru.Remove(oldest).(*entry[K]).key)
		}
		lim = rate.NewLimiter(l.rate, l.burst)
		l.byKey[key] = l.lru.PushFront(&entry[K]{key: key, lim: lim})
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

// Len is how many keys are remembered.
func (l *Limiter[K]) Len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}
