package httpapi

import (
	"container/list"
	"math"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxLimitedClients bounds the clients whose POST /sessions pace is
// remembered (a few MB at most); beyond it the least recently seen client
// is forgotten, which gives it a full bucket again.
const maxLimitedClients = 16384

// clientLimiter is a token bucket per client (connlimit.ClientKey), in a
// bounded LRU map.
type clientLimiter struct {
	rate  rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	byKey map[netip.Addr]*list.Element
	lru   list.List // *limiterEntry, most recently used first
}

type limiterEntry struct {
	key netip.Addr
	lim *rate.Limiter
}

// newClientLimiter allows perSecond per client with a burst of three
// seconds' worth (at least 1); nil for perSecond <= 0 (no limit).
func newClientLimiter(perSecond float64, maxClients int) *clientLimiter {
	if perSecond <= 0 {
		return nil
	}
	return &clientLimiter{rate: rate.Limit(perSecond), burst: max(1, int(math.Ceil(3*perSecond))),
		max: maxClients, byKey: map[netip.Addr]*list.Element{}}
}

// allow takes a token of key's bucket at now; when there is none, it
// returns how long until there is one (and takes nothing).
func (c *clientLimiter) allow(key netip.Addr, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lim *rate.Limiter
	if e, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(e)
		lim = e.Value.(*limiterEntry).lim
	} else {
		if c.lru.Len() >= c.max {
			oldest := c.lru.Back()
			delete(c.byKey, c.lru.Remove(oldest).(*limiterEntry).key)
		}
		lim = rate.NewLimiter(c.rate, c.burst)
		c.byKey[key] = c.lru.PushFront(&limiterEntry{key: key, lim: lim})
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

func (c *clientLimiter) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
