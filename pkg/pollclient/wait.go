package pollclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

const (
	// maxBackoff caps the wait between retries after failures.
	maxBackoff = 30 * time.Second
	// minWait keeps a provider that says "Retry-After: 0" from turning the
	// loop into a busy one.
	minWait = 250 * time.Millisecond
	// expirySlack lets transient failures be retried a little past the
	// session's expiry: a session completed just before it expired stays
	// available for the provider's grace period.
	expirySlack = time.Minute
	// maxLongPoll caps the wait this client asks a provider for, whatever
	// it advertises.
	maxLongPoll = 30 * time.Second
	// longPollSlack is how much longer than the wait asked for a long poll
	// may take before the client gives up on it and retries.
	longPollSlack = 10 * time.Second
)

// PollState says what a poll that did not end the wait was answered with.
type PollState string

const (
	// StatePending: the user has not finished in the browser yet.
	StatePending PollState = "pending"
	// StateSlowDown: the provider asked the client to poll less often.
	StateSlowDown PollState = "slow_down"
	// StateRetrying: the poll failed on the network or with a server error
	// and will be retried.
	StateRetrying PollState = "retrying"
)

// Progress reports a poll that did not end the wait.
type Progress struct {
	// Attempt counts polls from 1.
	Attempt int
	State   PollState
	// StatusCode is the HTTP status, 0 if no answer came.
	StatusCode int
	// Err is what went wrong, for StateRetrying.
	Err error
	// Wait is how long until the next poll.
	Wait time.Duration
}

// WaitOption changes how Wait behaves.
type WaitOption func(*waitOptions)

type waitOptions struct {
	progress func(Progress)
}

// WithProgress calls f after every poll that did not end the wait, from the
// goroutine that called Wait.
func WithProgress(f func(Progress)) WaitOption {
	return func(o *waitOptions) { o.progress = f }
}

// Wait polls until the provider hands over the BindingResponse, a terminal
// answer ends the session, ctx ends, or the session expires. It signs every
// poll with a fresh nonce, waits the provider's poll interval between polls
// and its Retry-After when asked to slow down, and retries network errors
// and server errors with exponential backoff.
//
// When the provider advertises long polling (Provider.LongPollMaxWait),
// every poll asks it with "Prefer: wait=N" (N at most 30 s) to hold the
// poll until the session ends, so the response arrives as soon as the user
// is done; polls then start a poll interval apart, counted from the start
// of the previous one (docs/long-polling.md).
//
// Terminal answers are returned as a *ServerError that errors.Is matches
// against ErrAccessDenied, ErrInvalidSignature, ErrExpired or
// ErrInvalidRequest; a BindingResponse that fails validation yields
// ErrInvalidResponse.
func (s *Session) Wait(ctx context.Context, opts ...WaitOption) (*Result, error) {
	var o waitOptions
	for _, opt := range opts {
		opt(&o)
	}
	c := s.client
	interval := s.provider.PollInterval
	b := backoff{base: interval, max: maxBackoff}
	giveUp := s.deadline.Add(expirySlack)
	longPoll := s.longPollWait()
	var lastErr error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !c.now().Before(giveUp) {
			if lastErr != nil {
				return nil, fmt.Errorf("%w: session %s ended at %s without an answer, last error: %v", ErrExpired, s.ID, s.ExpiresAt.Format(time.RFC3339), lastErr)
			}
			return nil, fmt.Errorf("%w: session %s ended at %s without an answer", ErrExpired, s.ID, s.ExpiresAt.Format(time.RFC3339))
		}
		started := c.now()
		p := s.poll(ctx, longPoll)
		var wait time.Duration
		floor := minWait
		switch p.state {
		case "":
			if p.err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, p.err
			}
			return p.result, nil
		case StatePending:
			b.reset()
			wait = interval
			if longPoll > 0 {
				// The interval counts from the start of the held poll
				// (the provider counts from when it received it).
				wait = max(interval-c.now().Sub(started), 0)
				floor = 0
			}
		case StateSlowDown:
			wait = interval
			if p.waitSet {
				wait = p.wait
			}
		case StateRetrying:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = p.err
			wait = max(b.next(), p.wait)
		}
		wait = max(wait, floor)
		if left := giveUp.Sub(c.now()); wait > left {
			wait = max(left, 0)
		}
		if o.progress != nil {
			o.progress(Progress{Attempt: attempt, State: p.state, StatusCode: p.status, Err: p.err, Wait: wait})
		}
		if err := c.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// pollResult is the outcome of one poll: a result or a terminal error
// (state ""), or a state to go on from.
type pollResult struct {
	state  PollState
	status int
	result *Result
	err    error
	wait   time.Duration // from Retry-After
	// waitSet says the provider sent a readable Retry-After.
	waitSet bool
}

// longPollWait is the wait to ask the provider for: what it advertises,
// in whole seconds, at most maxLongPoll, and short enough that the HTTP
// client's own timeout leaves longPollSlack; 0 for plain polling.
func (s *Session) longPollWait() time.Duration {
	d := min(s.provider.LongPollMaxWait, maxLongPoll)
	if t := s.client.api.Timeout; t > 0 {
		d = min(d, t-longPollSlack)
	}
	return max(d.Truncate(time.Second), 0)
}

func (s *Session) poll(ctx context.Context, longPoll time.Duration) pollResult {
	c := s.client
	if longPoll >= time.Second {
		// The provider answers within the wait; give up on a poll that
		// takes much longer and retry.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, longPoll+longPollSlack)
		defer cancel()
	}
	u, err := protocol.SignURL(s.secret, s.ID, http.MethodGet, s.provider.PollURL, nil)
	if err != nil {
		return pollResult{err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return pollResult{err: err}
	}
	req.Header.Set("Accept", "application/json")
	if longPoll >= time.Second {
		req.Header.Set("Prefer", "wait="+strconv.FormatInt(int64(longPoll/time.Second), 10))
	}
	// A poll must never reach the provider twice: its nonce is single-use,
	// and a replay would be refused as invalid_signature. net/http replays a
	// GET whose reused connection broke, even when the provider may have
	// handled it; an empty body without GetBody makes the request
	// non-replayable (it is still sent without a body), and this loop
	// retries with a fresh nonce instead.
	req.Body = io.NopCloser(strings.NewReader(""))
	resp, err := c.do(c.api, req)
	if err != nil {
		return pollResult{state: StateRetrying, err: fmt.Errorf("polling: %w", err)}
	}
	body, err := readBody(resp, c.MaxBodyBytes)
	if err != nil {
		var tooLarge errTooLarge
		if errors.As(err, &tooLarge) {
			return pollResult{status: resp.StatusCode, err: fmt.Errorf("%w: %v", ErrInvalidResponse, err)}
		}
		// The connection dropped mid-answer; a completed session stays
		// available for the grace period, so polling again gets it.
		return pollResult{state: StateRetrying, status: resp.StatusCode, err: fmt.Errorf("reading poll answer: %w", err)}
	}
	ra, raSet := retryAfter(resp.Header, c.now())
	switch {
	case resp.StatusCode == http.StatusOK:
		res, err := s.decodeResult(resp, body)
		return pollResult{status: resp.StatusCode, result: res, err: err}
	case resp.StatusCode == http.StatusTooManyRequests:
		return pollResult{state: StateSlowDown, status: resp.StatusCode, wait: ra, waitSet: raSet}
	case resp.StatusCode >= 500:
		return pollResult{state: StateRetrying, status: resp.StatusCode, wait: ra,
			err: newServerError(resp.StatusCode, errorBody(body))}
	}
	e := errorBody(body)
	if resp.StatusCode == http.StatusForbidden && e.Error == v1alpha1.ErrorAuthorizationPending {
		return pollResult{state: StatePending, status: resp.StatusCode}
	}
	return pollResult{status: resp.StatusCode, err: newServerError(resp.StatusCode, e)}
}

// backoff yields exponentially growing waits with jitter, so that many
// clients of a recovering provider do not return in step.
type backoff struct {
	base, max time.Duration
	n         int
}

func (b *backoff) next() time.Duration {
	d := b.base
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	b.n++
	// Between three quarters and all of d.
	return d - time.Duration(rand.Int64N(int64(d/4)+1))
}

func (b *backoff) reset() { b.n = 0 }
