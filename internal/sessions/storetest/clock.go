package storetest

import (
	"time"

	"github.com/kbprovider/backend/internal/testutil/fakeclock"
)

// Clock is a fake clock for stores under test: time moves only when the
// test advances it (fakeclock.Clock). Safe for concurrent use.
type Clock = fakeclock.Clock

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return fakeclock.At(start) }
