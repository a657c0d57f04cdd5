package testutil

import (
	"sync"
	"time"
)

// Clock is the one fake clock of the tests: a base time (fixed or real)
// plus an offset that only Advance changes. Safe for concurrent use.
type Clock struct {
	base   func() time.Time
	mu     sync.Mutex
	offset time.Duration
}

// ClockAt returns a clock that reads start until it is advanced.
func ClockAt(start time.Time) *Clock { return &Clock{base: func() time.Time { return start }} }

// RealClock returns a clock that runs with real time, plus what it was
// advanced by (for parts that also see real timers, e.g. an HTTP client).
func RealClock() *Clock { return &Clock{base: time.Now} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base().Add(c.offset)
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}
