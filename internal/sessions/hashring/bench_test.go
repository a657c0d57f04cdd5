package hashring

import (
	"strconv"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// benchmarkPoll polls sessions owned by rs[0] through via, each session
// up to 300 times (a 10-minute session polled every 2s).
func benchmarkPoll(b *testing.B, viaOwner bool) {
	rs := startRing(b, 2, sessions.Limits{MaxSessions: 1 << 20}, time.Now)
	via := rs[1]
	if viaOwner {
		via = rs[0]
	}
	const perSession = 300
	ids := make([]string, 0, b.N/perSession+1)
	for i := 0; len(ids) < cap(ids); i++ {
		id := "bench-" + strconv.Itoa(i)
		if rs[0].Owner(id) != rs[0].url {
			continue
		}
		if err := rs[0].Create(ctx, testSession(id, time.Now())); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	nonces := make([]string, b.N)
	for i := range nonces {
		nonces[i] = "nonce-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := via.RecordPoll(ctx, ids[i/perSession], nonces[i], 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRecordPollOnOwner(b *testing.B)    { benchmarkPoll(b, true) }
func BenchmarkRecordPollOnNonOwner(b *testing.B) { benchmarkPoll(b, false) }

// BenchmarkGetOnNonOwner is the other half of a poll on a non-owner: the
// signature check needs the session's secret.
func BenchmarkGetOnNonOwner(b *testing.B) {
	rs := startRing(b, 2, sessions.DefaultLimits, time.Now)
	id := ""
	for i := 0; ; i++ {
		if id = "get-" + strconv.Itoa(i); rs[0].Owner(id) == rs[0].url {
			break
		}
	}
	if err := rs[0].Create(ctx, testSession(id, time.Now())); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := rs[1].Get(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
