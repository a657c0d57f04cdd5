package pollclient

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// advertise makes the fake provider offer long polling with maxWait.
func (f *fakeProvider) advertise(maxWait string) {
	doc := f.doc
	f.doc = func(base string) v1alpha1.BindingProvider {
		d := doc(base)
		for _, m := range d.AuthenticationMethods {
			if m.OAuth2CodeGrantPoll != nil {
				m.OAuth2CodeGrantPoll.LongPollMaxWait = maxWait
			}
		}
		return d
	}
}

// recordPrefer wraps an answer, recording the poll's Prefer header and
// moving the fake clock by held, as if the provider held the poll.
func recordPrefer(seen *[]string, ft **fakeTime, held time.Duration, a answer) answer {
	return func(w http.ResponseWriter, r *http.Request) {
		*seen = append(*seen, r.Header.Get("Prefer"))
		if held > 0 {
			(*ft).mu.Lock()
			(*ft).now = (*ft).now.Add(held)
			(*ft).mu.Unlock()
		}
		a(w, r)
	}
}

// With long polling advertised, every poll asks to wait (capped at 30s);
// after a poll that was held, the next one starts a poll interval after
// the start of the held one (at once, after a long hold); after one the
// provider answered at once, a poll interval later.
func TestWaitLongPolls(t *testing.T) {
	f := newFakeProvider(t)
	f.advertise("45s")
	var ft *fakeTime
	var prefer []string
	want := bindingResponse(t, f.sid)
	f.polls = []answer{
		recordPrefer(&prefer, &ft, 30*time.Second, pending()),        // held for the whole wait
		recordPrefer(&prefer, &ft, 0, pending()),                     // answered at once (e.g. the provider's limit)
		recordPrefer(&prefer, &ft, 1500*time.Millisecond, pending()), // released early (a shutdown)
		recordPrefer(&prefer, &ft, 3*time.Second, okAnswer(want)),
	}
	s, fakeT := open(t, f)
	ft = fakeT
	if s.provider.LongPollMaxWait != 45*time.Second {
		t.Fatalf("LongPollMaxWait %s", s.provider.LongPollMaxWait)
	}
	res, err := s.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Response.Authentication.OAuth2CodeGrant.SessionID != f.sid {
		t.Fatalf("result %+v", res.Response)
	}
	if got := fmt.Sprint(prefer); got != "[wait=30 wait=30 wait=30 wait=30]" {
		t.Errorf("Prefer headers %s", got)
	}
	if got := fmt.Sprint(ft.Sleeps()); got != "[0s 2s 500ms]" {
		t.Errorf("waits between polls %s, want [0s 2s 500ms]", got)
	}
}

// Without long polling advertised, or with a value the client cannot
// read, polls do not ask to wait and keep their spacing.
func TestWaitWithoutLongPoll(t *testing.T) {
	for _, adv := range []string{"", "soon", "-5s", "0s"} {
		f := newFakeProvider(t)
		f.advertise(adv)
		var ft *fakeTime
		var prefer []string
		f.polls = []answer{recordPrefer(&prefer, &ft, 0, pending()), recordPrefer(&prefer, &ft, 0, okAnswer(bindingResponse(t, f.sid)))}
		s, fakeT := open(t, f)
		ft = fakeT
		if s.provider.LongPollMaxWait != 0 {
			t.Errorf("%q: LongPollMaxWait %s", adv, s.provider.LongPollMaxWait)
		}
		if _, err := s.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(prefer); got != "[ ]" {
			t.Errorf("%q: Prefer headers %q", adv, got)
		}
		if got := fmt.Sprint(ft.Sleeps()); got != "[2s]" {
			t.Errorf("%q: waits %s", adv, got)
		}
	}
}

// The wait asked for leaves room under the HTTP client's own timeout; a
// timeout too short for any wait means plain polling.
func TestLongPollFitsTheHTTPTimeout(t *testing.T) {
	for timeout, want := range map[time.Duration]string{
		time.Minute:      "wait=30",
		25 * time.Second: "wait=15",
		0:                "wait=30",
		10 * time.Second: "",
	} {
		f := newFakeProvider(t)
		f.advertise("30s")
		var prefer []string
		var ft *fakeTime
		f.polls = []answer{recordPrefer(&prefer, &ft, 0, okAnswer(bindingResponse(t, f.sid)))}
		c := New(&http.Client{Timeout: timeout})
		ft = installFakeTime(c, fakeStart)
		s, err := c.CreateSession(context.Background(), discover(t, c, f), "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(prefer) != 1 || prefer[0] != want {
			t.Errorf("HTTP timeout %s: Prefer %q, want %q", timeout, prefer, want)
		}
	}
}

// A held poll that takes far longer than the wait asked for is given up
// and retried with a fresh nonce.
func TestLongPollGivenUpAndRetried(t *testing.T) {
	f := newFakeProvider(t)
	f.advertise("1s")
	release := make(chan struct{})
	defer close(release)
	f.polls = []answer{
		func(w http.ResponseWriter, r *http.Request) {
			f.mu.Unlock() // let other polls in while this one hangs
			defer f.mu.Lock()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		},
		okAnswer(bindingResponse(t, f.sid)),
	}
	s, _ := open(t, f)
	var progress []Progress
	start := time.Now()
	if _, err := s.Wait(context.Background(), WithProgress(func(p Progress) { progress = append(progress, p) })); err != nil {
		t.Fatal(err)
	}
	if len(progress) != 1 || progress[0].State != StateRetrying {
		t.Fatalf("progress %+v, want one retry", progress)
	}
	if took := time.Since(start); took < time.Second+longPollSlack {
		t.Fatalf("gave up after %s, before the wait and its slack", took)
	}
}
