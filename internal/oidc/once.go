package oidc

import (
	"context"
	"errors"
	"sync"
	"time"
)

// memoryOnce is the single-replica default for Config.UseOnce: a bounded
// set of used keys, each remembered until any state carrying it expired.
type memoryOnce struct {
	clock func() time.Time
	ttl   time.Duration
	limit int

	mu   sync.Mutex
	used map[string]time.Time // key -> forget after
}

var errOnceFull = errors.New("too many logins in progress")

func newMemoryOnce(clock func() time.Time, ttl time.Duration, limit int) *memoryOnce {
	return &memoryOnce{clock: clock, ttl: ttl, limit: limit, used: map[string]time.Time{}}
}

func (m *memoryOnce) use(_ context.Context, _ []byte, key string) error {
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.used[key]; ok {
		return errors.New("used before")
	}
	if len(m.used) >= m.limit {
		for k, until := range m.used {
			if now.After(until) {
				delete(m.used, k)
			}
		}
		if len(m.used) >= m.limit {
			return errOnceFull
		}
	}
	m.used[key] = now.Add(m.ttl + time.Minute)
	return nil
}
