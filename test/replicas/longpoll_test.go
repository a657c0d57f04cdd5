package replicas

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/hmac"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// longPoll is what a client that long polls does (pkg/pollclient): signed
// polls with "Prefer: wait=N" to replica r, one after another, until one
// brings the BindingResponse. It returns when the client held it.
func longPoll(ctx context.Context, r *replica, s *session, wait int, held chan<- struct{}) (time.Time, error) {
	client := &http.Client{Timeout: time.Duration(wait)*time.Second + 10*time.Second}
	for first := true; ; first = false {
		u := *s.signedPollURL()
		u.Scheme, u.Host = "http", r.addr
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if wait > 0 {
			req.Header.Set("Prefer", fmt.Sprintf("wait=%d", wait))
		}
		if first && held != nil {
			close(held) // sent: the replica holds it from now on
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return time.Time{}, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return time.Time{}, err
		}
		switch {
		case resp.StatusCode == http.StatusOK:
			return time.Now(), nil
		case resp.StatusCode == http.StatusForbidden && strings.Contains(string(b), v1alpha1.ErrorAuthorizationPending):
			// The next poll a poll interval after this one's start.
			select {
			case <-time.After(time.Until(start.Add(pollInterval))):
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			}
		default:
			return time.Time{}, fmt.Errorf("poll on %s: %d %s", r.name, resp.StatusCode, b)
		}
	}
}

// TestLongPollLatency measures, with two replica processes in a hashring,
// a real control plane and a real identity provider, how long it takes from
// pressing Bind (the POST of the selection page, through replica-0) to the
// client holding the BindingResponse, when the client's long poll is held
// on the session's owner and when it is held on the other replica; and,
// for comparison, with plain polling (one poll per second). It reports the
// figures and fails only when a bind does not reach its client.
func TestLongPollLatency(t *testing.T) {
	cp := controlplane.Get(t)
	prepareCluster(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	reps := []*replica{newReplica(t, "replica-0"), newReplica(t, "replica-1")}
	f := newFront(t, reps...)
	f.pin(reps[0]) // the browser's requests
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{f.url + "/callback"}, Users: []oidcprovider.User{alice}})
	keys, peers := newRingKeys(t), peerURLs(reps)
	for _, r := range reps {
		r.args = append(r.ringArgs(keys, reps, f.url, idp, cp),
			"--long-poll-max-wait", "30s",
			"--log-level", "info",
		)
		r.start(t)
	}
	for _, r := range reps {
		r.waitReady(t)
	}
	ring := newOwnerRing(t, peers[0])
	byPeer := map[string]*replica{reps[0].peerURL: reps[0], reps[1].peerURL: reps[1]}

	const samples = 10
	type kase struct {
		name     string
		wait     int  // Prefer: wait; 0 = plain polling
		atOwner  bool // poll the owner (else the other replica)
		n        int
		measured []time.Duration
		// afterPage: from the bind page's arrival in the browser (the
		// session completed before it) to the client holding the
		// response: the delivery alone, without the provisioning.
		afterPage []time.Duration
	}
	cases := []*kase{
		{name: "long poll held on the owner", wait: 30, atOwner: true, n: samples},
		{name: "long poll held on the non-owner", wait: 30, atOwner: false, n: samples},
		{name: "plain polling every 1s (no Prefer), on the non-owner", wait: 0, atOwner: false, n: samples / 2},
	}
	for round := 0; round < samples; round++ {
		for _, c := range cases {
			if round >= c.n {
				continue
			}
			s := mustCreate(t, reps[0], f.url, "")
			owner := byPeer[ring.owner(peers, s.SessionID)]
			at := owner
			if !c.atOwner {
				at = reps[0]
				if owner == reps[0] {
					at = reps[1]
				}
			}
			sel := openSelection(t, ctx, idp, f, s, alice)
			held := make(chan struct{})
			got := make(chan time.Time, 1)
			errs := make(chan error, 1)
			go func() {
				at, err := longPoll(ctx, at, s, c.wait, held)
				if err != nil {
					errs <- err
					return
				}
				got <- at
			}()
			<-held
			// Let the first poll reach the replica and be held there (or,
			// for plain polling, be answered pending).
			time.Sleep(300 * time.Millisecond)
			pressed := time.Now()
			if code, page := sel.bind(t, ctx); code != http.StatusOK {
				t.Fatalf("%s: bind answered %d:\n%s", c.name, code, page)
			}
			pageBack := time.Now()
			select {
			case done := <-got:
				c.measured = append(c.measured, done.Sub(pressed))
				c.afterPage = append(c.afterPage, done.Sub(pageBack))
			case err := <-errs:
				t.Fatalf("%s: the client did not get the response: %v", c.name, err)
			case <-time.After(2 * time.Minute):
				t.Fatalf("%s: the client did not get the response within 2 minutes", c.name)
			}
		}
	}
	for _, c := range cases {
		slices.Sort(c.measured)
		slices.Sort(c.afterPage)
		t.Logf("%s: pressing Bind → client holds the response, %d binds: p50 %s, p90 %s, min %s, max %s (all: %v); "+
			"bind page back → client holds it: p50 %s, max %s (negative: before the page)",
			c.name, len(c.measured), quantile(c.measured, 0.5), quantile(c.measured, 0.9), c.measured[0], c.measured[len(c.measured)-1], c.measured,
			quantile(c.afterPage, 0.5), c.afterPage[len(c.afterPage)-1].Round(time.Millisecond))
	}
}

// quantile of sorted ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)].Round(time.Millisecond)
}

// signedPollURL is signedPoll without a *testing.T, for goroutines.
func (s *session) signedPollURL() *url.URL {
	u, _ := url.Parse(s.ext + "/poll")
	signed, _ := hmac.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	return signed
}
