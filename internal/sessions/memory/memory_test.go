package memory

import (
	"testing"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/conformance"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, limits sessions.Limits, clock *testutil.Clock) sessions.Store {
		return New(limits, clock.Now)
	})
}
