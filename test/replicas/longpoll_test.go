package replicas

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"
)

// TestLongPollLatency measures, with two replicas, from pressing Bind (the
// POST of the selection page, through replica A) to a long poll
// ("Prefer: wait=25") held on replica B returning the BindingResponse:
// B hears of the outcome from its informer of the session records. It
// reports p50 and p90 of ten binds (the target is < 300 ms) and fails only
// when a bind does not reach its client within 5 s.
func TestLongPollLatency(t *testing.T) {
	const binds = 10
	c := newCluster(t, clusterOpts{replicas: 2, args: []string{"--long-poll-max-wait", "30s"}})
	a, b := c.reps[0], c.reps[1]

	var fromPress, fromPage []time.Duration
	for i := range binds {
		s := c.create(t, a)
		c.f.pin(a)
		sel := c.openSelection(t, s)

		type result struct {
			a  pollAnswer
			at time.Time
		}
		got := make(chan result, 1)
		go func() {
			ans := c.send(b, s.signedPoll(), http.Header{"Prefer": {"wait=25"}})
			got <- result{ans, time.Now()}
		}()
		// Held on B: its gauge of held long polls says so.
		testutil.Await(t, "the long poll is held on "+b.name, func() bool {
			return b.metric(t, "kube_bind_backend_long_polls_held") == 1
		})
		pressed := time.Now()
		c.mustBind(t, sel)
		pageBack := time.Now()
		select {
		case r := <-got:
			if r.a.err != nil || r.a.status != http.StatusOK {
				t.Fatalf("bind %d: the long poll on %s answered %s", i+1, b.name, r.a)
			}
			c.checkResponse(t, s, r.a.body)
			d := r.at.Sub(pressed)
			if d > answerWithin {
				t.Errorf("bind %d: the long poll returned %s after Bind was pressed, want within %s", i+1, d, answerWithin)
			}
			fromPress = append(fromPress, d)
			fromPage = append(fromPage, r.at.Sub(pageBack))
		case <-time.After(30 * time.Second):
			t.Fatalf("bind %d: the long poll on %s did not return within 30s of the Bind", i+1, b.name)
		}
	}
	slices.Sort(fromPress)
	slices.Sort(fromPage)
	t.Logf("Bind pressed on %s → long poll held on %s returns the response, %d binds: p50 %s, p90 %s, min %s, max %s",
		a.name, b.name, len(fromPress), quantile(fromPress, 0.5), quantile(fromPress, 0.9),
		fromPress[0].Round(time.Millisecond), fromPress[len(fromPress)-1].Round(time.Millisecond))
	t.Logf("bind page back in the browser → long poll returns: p50 %s, p90 %s (negative: before the page)",
		quantile(fromPage, 0.5), quantile(fromPage, 0.9))
}
