// Package await waits in tests for something that happens in the
// background (a controller, an informer, another process): one helper for
// every test package, instead of a copy in each.
package await

import (
	"testing"
	"time"
)

// DefaultTimeout is how long True waits: generous, because tests run on
// busy machines and must never depend on wall-clock speed.
const DefaultTimeout = 30 * time.Second

// True polls cond every 20ms until it holds, and fails the test after
// DefaultTimeout saying what it waited for.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, DefaultTimeout, 20*time.Millisecond, what, func() (bool, error) { return cond(), nil })
}

// Within polls cond every interval until it holds, and fails the test
// after timeout saying what it waited for and the last error cond gave.
func Within(t testing.TB, timeout, interval time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(interval)
	}
}
