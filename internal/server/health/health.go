// Package health holds the backend's checks. Two kinds, kept apart:
// readiness checks read this replica's own state (a shutdown flag, a
// cache's sync) and decide /readyz; a Monitor looks at the dependencies
// every replica shares (identity provider, provider cluster) on a timer
// and reports them to the operator only.
package health

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Check is one condition. Check returns nil when it holds, else an error
// saying in words what is missing, e.g. "discovery failing: dial tcp ...:
// connection refused". It must return promptly when ctx is done.
type Check interface {
	Name() string
	Check(ctx context.Context) error
}

// CheckFunc returns a Check named name that calls fn.
func CheckFunc(name string, fn func(ctx context.Context) error) Check {
	return funcCheck{name: name, fn: fn}
}

type funcCheck struct {
	name string
	fn   func(context.Context) error
}

func (c funcCheck) Name() string                    { return c.name }
func (c funcCheck) Check(ctx context.Context) error { return c.fn(ctx) }

// Status is a Check whose state is set by a component working in the
// background (for example a discovery loop that retries): Set(nil) when it
// became ready, Set(err) when it is not. Safe for concurrent use.
type Status struct {
	name string
	mu   sync.RWMutex
	err  error
}

// NewStatus returns a Status named name in state initial (nil: ready).
func NewStatus(name string, initial error) *Status {
	return &Status{name: name, err: initial}
}

func (s *Status) Name() string { return s.name }

// Set records the current state.
func (s *Status) Set(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

func (s *Status) Check(context.Context) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.err
}

// Result is the outcome of one Check.
type Result struct {
	Name string
	Err  error
}

// ErrTimeout is the result of a check that did not answer in time.
var ErrTimeout = errors.New("check timed out")

// Run runs every check concurrently, each bounded by timeout, and returns
// the results in the order of checks. A check that panics counts as failed.
func Run(ctx context.Context, checks []Check, timeout time.Duration) []Result {
	results := make([]Result, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		results[i].Name = c.Name()
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				defer func() {
					if p := recover(); p != nil {
						done <- errors.New("check panicked")
					}
				}()
				done <- c.Check(cctx)
			}()
			select {
			case err := <-done:
				results[i].Err = err
			case <-cctx.Done():
				results[i].Err = ErrTimeout
			}
		}()
	}
	wg.Wait()
	return results
}
