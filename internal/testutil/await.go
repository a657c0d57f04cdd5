package testutil

import (
	"time"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// AwaitTimeout is how long Await waits: generous, because tests run on
// busy machines and must never depend on wall-clock speed.
const AwaitTimeout = 30 * time.Second

// Await polls cond every 20ms until it holds, and fails the test after
// AwaitTimeout saying what it waited for.
func Await(t tb.TB, what string, cond func() bool) {
	t.Helper()
	AwaitWithin(t, AwaitTimeout, 20*time.Millisecond, what, func() (bool, error) { return cond(), nil })
}

// AwaitWithin polls cond every interval until it holds, and fails the test
// after timeout saying what it waited for and the last error cond gave.
func AwaitWithin(t tb.TB, timeout, interval time.Duration, what string, cond func() (bool, error)) {
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
