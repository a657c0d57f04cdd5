package memory

import (
	"testing"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, limits sessions.Limits, clock *storetest.Clock) sessions.Store {
		return New(limits, clock.Now)
	})
}
