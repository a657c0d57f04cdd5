package replicas

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// TestSessionFlood: one client sends 100,000 POST /sessions to one
// replica, on a few keep-alive connections (that replica runs with
// --session-create-rate=0, or the flood would be paced). A session is
// derived from keys and stored nowhere, so the flood costs no memory: the
// replica's resident set after it is within 50 MB of before. Meanwhile
// another client (127.0.0.2) floods the other replica, which keeps the
// default rate limit and answers it 429 beyond its pace; other clients
// (127.0.0.1) create sessions on both replicas and poll them, a user
// binds one, and every answer comes within a few seconds, never a 429.
func TestSessionFlood(t *testing.T) {
	const (
		total      = 100_000
		workers    = 4
		otherBound = 3 * time.Second // each answer to the other clients
		rssBound   = 50 << 20
	)
	c := newCluster(t, clusterOpts{replicas: 2, noStart: true})
	target, other := c.reps[0], c.reps[1]
	target.args = append(target.args, "--session-create-rate=0")
	for _, r := range c.reps {
		r.start(t)
	}
	for _, r := range c.reps {
		r.waitReady(t)
	}

	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	flooder := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	post := func() (int, []byte, error) {
		resp, err := flooder.Post("http://"+target.addr+"/sessions", "application/json", strings.NewReader("{}"))
		if err != nil {
			return 0, nil, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, b, err
	}
	// Warm up the connections and the replica's pools before measuring.
	for range 1000 {
		if code, b, err := post(); err != nil || code != http.StatusCreated {
			t.Fatalf("POST /sessions: %d %s %v", code, b, err)
		}
	}
	rssBefore, _ := target.memory(t)
	createdBefore := target.metric(t, "kube_bind_backend_sessions_created_total")

	// The other clients, until the flood is over.
	stop := make(chan struct{})
	var others sync.WaitGroup
	answers := &latencies{}
	var otherRequests atomic.Int64
	timed := func(what string, r *replica, do func() (int, string, error), want int, wantCode string) {
		start := time.Now()
		status, code, err := do()
		took := time.Since(start)
		answers.add(took)
		otherRequests.Add(1)
		switch {
		case err != nil:
			t.Errorf("during the flood, %s on %s: %v", what, r.name, err)
		case status != want || code != wantCode:
			t.Errorf("during the flood, %s on %s: %d %s; want %d %s", what, r.name, status, code, want, wantCode)
		case took > otherBound:
			t.Errorf("during the flood, %s on %s answered after %s, want within %s", what, r.name, took, otherBound)
		}
	}
	others.Go(func() {
		var mine []*session
		for i := 0; ; i++ {
			r := []*replica{target, other}[i%2]
			timed("POST /sessions", r, func() (int, string, error) {
				resp, err := c.client.Post("http://"+r.addr+"/sessions", "application/json", strings.NewReader("{}"))
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				s := &session{ext: c.ext}
				if err := json.NewDecoder(resp.Body).Decode(&s.PollSession); err == nil && resp.StatusCode == http.StatusCreated {
					mine = append(mine, s)
				}
				return resp.StatusCode, "", nil
			}, http.StatusCreated, "")
			// Each of the last few sessions polled on the flooded replica.
			for _, s := range mine[max(0, len(mine)-3):] {
				timed("poll", target, func() (int, string, error) {
					a := c.poll(target, s)
					return a.status, a.code, a.err
				}, http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
			}
			select {
			case <-stop:
				return
			case <-time.After(pollGap):
			}
		}
	})

	// A flood from another client on the rate-limited replica: paced
	// (429 slow_down beyond --session-create-rate, default 10/s with a
	// burst of 30), while the other clients on that replica are not.
	limitedTr := &http.Transport{MaxIdleConnsPerHost: 2, MaxConnsPerHost: 2,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
	t.Cleanup(limitedTr.CloseIdleConnections)
	limitedFlooder := &http.Client{Transport: limitedTr, Timeout: 30 * time.Second}
	var limitedCreated, limitedSlowed atomic.Int64
	var limitedOther atomic.Pointer[string]
	limitedBegan := time.Now()
	others.Go(func() {
		for {
			select { // about 50 a second, five times the pace
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			resp, err := limitedFlooder.Post("http://"+other.addr+"/sessions", "application/json", strings.NewReader("{}"))
			if err != nil {
				msg := err.Error()
				limitedOther.CompareAndSwap(nil, &msg)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusCreated:
				limitedCreated.Add(1)
			case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" &&
				strings.Contains(string(b), `"slow_down"`):
				limitedSlowed.Add(1)
			default:
				msg := fmt.Sprintf("%d %.200s", resp.StatusCode, b)
				limitedOther.CompareAndSwap(nil, &msg)
			}
		}
	})

	var sent, refused atomic.Int64
	var firstRefusal atomic.Pointer[string]
	var flood sync.WaitGroup
	began := time.Now()
	for range workers {
		flood.Go(func() {
			for sent.Add(1) <= total {
				code, b, err := post()
				if err != nil || code != http.StatusCreated {
					refused.Add(1)
					msg := fmt.Sprintf("%d %.200s %v", code, b, err)
					firstRefusal.CompareAndSwap(nil, &msg)
				}
			}
		})
	}
	// A user binds a session created on the flooded replica meanwhile.
	s := c.create(t, target)
	bindStart := time.Now()
	c.bindVia(t, s, target, target)
	bindTook := time.Since(bindStart)
	time.Sleep(pollGap)
	c.deliver(t, target, s, answerWithin)

	flood.Wait()
	took := time.Since(began)
	close(stop)
	others.Wait()
	rssAfter, peak := target.memory(t)
	created := target.metric(t, "kube_bind_backend_sessions_created_total") - createdBefore

	t.Logf("flood: %d POST /sessions on %d connections in %s: %.0f sessions/s; %d refused", total, workers, took.Round(time.Millisecond), float64(total)/took.Seconds(), refused.Load())
	t.Logf("flooded replica: VmRSS %.1f MB before, %.1f MB after (%+.1f MB), peak VmHWM %.1f MB; sessions_created_total +%.0f",
		mb(rssBefore), mb(rssAfter), mb(rssAfter-rssBefore), mb(peak), created)
	t.Logf("other clients meanwhile: %d requests, %s; a whole browser part took %s", otherRequests.Load(), answers, bindTook.Round(time.Millisecond))
	if n := refused.Load(); n > 0 {
		t.Errorf("%d of %d POST /sessions not answered 201, e.g. %s", n, total, *firstRefusal.Load())
	}
	if created < total {
		t.Errorf("sessions_created_total grew by %.0f, want %d", created, total)
	}
	if rssAfter-rssBefore > rssBound {
		t.Errorf("the flooded replica's resident set grew by %.1f MB, want at most %.0f MB", mb(rssAfter-rssBefore), mb(rssBound))
	}
	limitedTook := time.Since(limitedBegan)
	t.Logf("flood of the rate-limited replica from 127.0.0.2 for %s: %d created, %d answered 429 slow_down",
		limitedTook.Round(time.Millisecond), limitedCreated.Load(), limitedSlowed.Load())
	if m := limitedOther.Load(); m != nil {
		t.Errorf("the flood of the rate-limited replica got neither 201 nor 429 slow_down with Retry-After, e.g. %s", *m)
	}
	if limitedSlowed.Load() == 0 {
		t.Error("the flood of the rate-limited replica was never answered 429")
	}
	if most := 30 + int64(10*limitedTook.Seconds()) + 10; limitedCreated.Load() > most {
		t.Errorf("the rate-limited replica created %d sessions for one client in %s, want at most %d", limitedCreated.Load(), limitedTook, most)
	}
	if otherRequests.Load() < 10 {
		t.Errorf("only %d requests of other clients during the flood", otherRequests.Load())
	}
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
