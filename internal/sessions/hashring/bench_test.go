package hashring

import (
	"encoding/json"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
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

// BenchmarkRecordPollOnNonOwnerConcurrent: many callers polling through
// a non-owner at once, as a loaded replica does; their requests share
// sealed batches (group commit). With two replicas the non-owner is the
// backup, so the owner's copy comes back in its answer.
func BenchmarkRecordPollOnNonOwnerConcurrent(b *testing.B) { benchmarkPollConcurrent(b, false) }

// BenchmarkRecordPollOnOwnerConcurrent: the same on the owner, whose
// copies to the backup share batches.
func BenchmarkRecordPollOnOwnerConcurrent(b *testing.B) { benchmarkPollConcurrent(b, true) }

func benchmarkPollConcurrent(b *testing.B, viaOwner bool) {
	rs := startRing(b, 2, sessions.Limits{MaxSessions: 1 << 20}, time.Now)
	via := rs[1]
	if viaOwner {
		via = rs[0]
	}
	const perSession = 300
	var ids []string
	for i := 0; len(ids) < b.N/perSession+64; i++ {
		id := "bench-" + strconv.Itoa(i)
		if rs[0].Owner(id) != rs[0].url {
			continue
		}
		if err := rs[0].Create(ctx, testSession(id, time.Now())); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1) - 1
			if _, err := via.RecordPoll(ctx, ids[i%int64(len(ids))], "nonce-"+strconv.FormatInt(i, 10), 0); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// The wire cost of a forwarded poll, without the network: what the
// non-owner and the owner spend on encoding and decoding (with
// encoding/json, and with wireJSON, which the peer API uses), and on
// sealing, opening and the replay check, per poll, in batches of 1 and 16.
// This decided that the encoding was worth making cheaper (wireJSON).
func BenchmarkWirePoll(b *testing.B) {
	s, err := newSealer(testKey)
	if err != nil {
		b.Fatal(err)
	}
	sess := toWire(testSession("gIwYVk68a15BcN0GhjeAbWsFWbI", time.Now()))
	d := memory.StaticDigest(fromWire(sess))
	digest := d[:]
	for _, n := range []int{1, 16} {
		b.Run("batch="+strconv.Itoa(n)+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i += n {
				reqs := make([][]byte, n)
				for k := range reqs {
					reqs[k], _ = json.Marshal(&peerRequest{Op: opPoll, ID: sess.ID, Nonce: "bm9uY2Utbm9uY2Utbm9uY2U", Interval: int64(time.Second), StaticDigest: digest})
				}
				var batch peerBatch
				if err := json.Unmarshal(encodeBatch(time.Now().UnixNano(), Sender{}, reqs), &batch); err != nil {
					b.Fatal(err)
				}
				resps := make([]*peerResponse, len(batch.Reqs))
				for k := range resps {
					w := *sess
					resps[k] = &peerResponse{Session: mutableOnly(&w)}
				}
				out, _ := json.Marshal(peerBatchResponse{Resps: resps})
				var br peerBatchResponse
				if err := json.Unmarshal(out, &br); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("batch="+strconv.Itoa(n)+"/wire-json", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i += n {
				reqs := make([][]byte, n)
				for k := range reqs {
					reqs[k] = mustJSON(&peerRequest{Op: opPoll, ID: sess.ID, Nonce: "bm9uY2Utbm9uY2Utbm9uY2U", Interval: int64(time.Second), StaticDigest: digest})
				}
				plain := encodeBatch(time.Now().UnixNano(), Sender{}, reqs)
				batch, err := decodeBatch(plain)
				if err != nil {
					b.Fatal(err)
				}
				resps := make([]*peerResponse, len(batch.Reqs))
				for k := range resps {
					w := *sess
					resps[k] = &peerResponse{Session: mutableOnly(&w)}
				}
				out := mustJSON(peerBatchResponse{Resps: resps})
				if _, err := decodeBatchResponse(out, n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("batch="+strconv.Itoa(n)+"/seal", func(b *testing.B) {
			reqs := make([][]byte, n)
			for k := range reqs {
				reqs[k] = mustJSON(&peerRequest{Op: opPoll, ID: sess.ID, Nonce: "bm9uY2Utbm9uY2Utbm9uY2U", Interval: int64(time.Second), StaticDigest: digest})
			}
			plain := encodeBatch(time.Now().UnixNano(), Sender{}, reqs)
			w := *sess
			resp := mustJSON(peerBatchResponse{Resps: slices.Repeat([]*peerResponse{{Session: mutableOnly(&w)}}, n)})
			replays := newReplayCache()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += n {
				if i > 0 && i%(maxRemembered/2) < n { // a fresh cache before this one is full
					b.StopTimer()
					replays = newReplayCache()
					b.StartTimer()
				}
				msg := s.seal(plain, aadRequest)
				nonce, _, err := s.open(msg, aadRequest)
				if err != nil {
					b.Fatal(err)
				}
				if err := replays.accept(nonce, time.Now(), time.Now()); err != nil {
					b.Fatal(err)
				}
				ans := s.seal(resp, responseAAD(nonce))
				if _, _, err := s.open(ans, responseAAD(nonce)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
