package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/kbprovider/backend/internal/httpapi/respond"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// Bounds on the signed parameters, so that nothing unbounded reaches the
// store. Nonces must carry at least 128 bits (22 base64url characters).
const (
	maxIDLen    = 128
	minNonceLen = 22
	maxNonceLen = 128
)

// The answer to a pending poll is the same every time: encoded once.
var pendingBody = respond.ErrorBody(v1alpha1.ErrorAuthorizationPending,
	"the user has not finished in the browser yet; poll again after pollInterval")

// poll is GET /poll (§4). The order matters: parameters are checked before
// the store is asked, the signature before the nonce is spent, and the
// nonce before the poll interval is enforced.
func (s *server) poll(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		s.pollError(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest, "the query string is malformed")
		return
	}
	sid, msg := single(q, protocol.ParamSession)
	if msg == "" && !protocol.URLSafe(sid, maxIDLen) {
		msg = "parameter s is not a session ID"
	}
	var nonce, sig string
	if msg == "" {
		nonce, msg = single(q, protocol.ParamNonce)
	}
	if msg == "" && (len(nonce) < minNonceLen || !protocol.URLSafe(nonce, maxNonceLen)) {
		msg = "parameter n must be a fresh nonce of at least 128 random bits, base64url-encoded"
	}
	if msg == "" {
		sig, msg = single(q, protocol.ParamSignature)
	}
	if msg != "" {
		s.pollError(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest, msg)
		return
	}
	// A GET has no use for a body, but a body is signed like any other.
	body, tooLarge, err := respond.ReadBody(w, r, maxPollBody)
	if tooLarge {
		s.pollError(w, http.StatusRequestEntityTooLarge, respond.ErrRequestTooLarge, respond.TooLargeMessage(maxPollBody))
		return
	} else if err != nil {
		s.pollError(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest, "the request body could not be read")
		return
	}

	ctx := r.Context()
	sess, err := s.bind.OpenPoll(sid)
	if err != nil || !sess.Flow.Polled() {
		// Unknown, expired, or a session of the callback flow: nobody
		// outside holds the latter's secret, and its result goes to the
		// CLI's callback, so it is nothing to poll.
		s.pollError(w, http.StatusGone, v1alpha1.ErrorExpiredToken, "the session expired or is unknown to the backend; start over")
		return
	}
	req := protocol.Request{Scheme: s.scheme, Host: s.host, Method: r.Method, Path: r.URL.EscapedPath(), Query: q, Body: body}
	if !protocol.Verify(sess.Secret, req, sig) {
		s.pollError(w, http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature,
			"the signature h does not match this request; sign it with the session secret for the URL "+
				"the backend advertises as pollURL")
		return
	}
	if err := s.bind.AdmitPoll(ctx, sess, nonce, s.minPollGap); err != nil {
		s.pollRefused(w, sess, err)
		return
	}
	outcome, err := s.bind.Outcome(ctx, sess)
	if err != nil {
		s.storeError(w, err)
		return
	}
	if sess.Ended && outcome.State != sessions.StateCompleted {
		s.pollError(w, http.StatusGone, v1alpha1.ErrorExpiredToken, "the session expired; start over")
		return
	}
	if outcome.State == sessions.StatePending {
		outcome = s.longPoll(w, r, sess, outcome)
	}
	switch outcome.State {
	case sessions.StateCompleted:
		// Deliver marks the binding delivered on the provider cluster
		// first: no response leaves unmarked.
		switch err := s.bind.Deliver(ctx, sess, outcome); {
		case errors.Is(err, lifecycle.ErrDelivered):
			s.pollError(w, http.StatusGone, v1alpha1.ErrorExpiredToken,
				"the binding response was delivered and its grace period is over; start over")
			return
		case errors.Is(err, lifecycle.ErrBindingGone):
			s.log.Info("a completed session's binding is gone", "session", sess.ID, "error", err)
			s.pollError(w, http.StatusGone, v1alpha1.ErrorExpiredToken,
				"the binding was removed from the provider cluster; start over")
			return
		case err != nil:
			s.deliveryError(w, sess, err)
			return
		}
		s.metrics.poll("completed")
		respond.JSONBytes(w, http.StatusOK, outcome.Response)
	case sessions.StateDenied:
		reason := outcome.DenyReason
		if reason == "" {
			reason = "the user cancelled or the provider refused this user"
		}
		s.pollError(w, http.StatusForbidden, v1alpha1.ErrorAccessDenied, "the binding was refused: "+reason)
	default:
		s.metrics.poll(v1alpha1.ErrorAuthorizationPending)
		respond.JSONBytes(w, http.StatusForbidden, pendingBody)
	}
}

// pollRefused answers a poll that was not admitted.
func (s *server) pollRefused(w http.ResponseWriter, sess lifecycle.Session, err error) {
	var soon *sessions.TooSoonError
	switch {
	case errors.As(err, &soon):
		respond.RetryAfter(w.Header(), respond.CeilSeconds(soon.RetryAfter))
		s.pollError(w, http.StatusTooManyRequests, v1alpha1.ErrorSlowDown,
			"polled sooner than pollInterval ("+s.cfg.PollInterval.String()+") after the previous poll; wait as long as Retry-After says")
	case errors.Is(err, sessions.ErrNonceUsed):
		s.pollError(w, http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature,
			"the nonce n was used before; sign every request with a fresh nonce")
	case errors.Is(err, sessions.ErrSessionOver):
		// Its owner no longer admits it (expired on the owner's clock,
		// or evicted under load): never again, so start over.
		s.pollError(w, http.StatusGone, v1alpha1.ErrorExpiredToken,
			"this session is over; start a new one")
	case errors.Is(err, sessions.ErrTooManyNonces):
		// No later poll of this session can succeed: wait for it to
		// expire and start over.
		respond.RetryAfter(w.Header(), respond.CeilSeconds(sess.ExpiresAt.Sub(s.cfg.Now())))
		s.pollError(w, http.StatusTooManyRequests, v1alpha1.ErrorSlowDown,
			"this session has made as many signed requests as it may; start over once it expired")
	default:
		s.storeError(w, err)
	}
}

// single returns the one value of key in q, or a message saying why there
// is not exactly one non-empty value.
func single(q url.Values, key string) (string, string) {
	if v, ok := protocol.Single(q, key); ok {
		return v, ""
	}
	if len(q[key]) > 1 {
		return "", "parameter " + key + " is given more than once"
	}
	return "", "parameter " + key + " is missing"
}

func (s *server) pollError(w http.ResponseWriter, status int, code, message string) {
	s.metrics.poll(code)
	respond.Error(w, status, code, message)
}

// storeError answers a failed store call: the store's trouble, not the
// client's, so 503 and the client polls again.
func (s *server) storeError(w http.ResponseWriter, err error) {
	outcome := "unavailable"
	switch {
	case errors.Is(err, sessions.ErrUnavailable):
		// The provider cluster is briefly unreachable: the session is
		// not lost, the client polls again.
		s.log.Warn("session store briefly unavailable", "error", err)
	case errors.Is(err, context.Canceled):
		// The client left, or the server is stopping: nobody waits
		// for this answer and the store did nothing wrong.
		s.log.Info("poll ended before the session store answered", "error", err)
		outcome = "canceled"
	default:
		s.log.Error("session store failed", "error", err)
	}
	s.metrics.poll(outcome)
	respond.RetryAfter(w.Header(), 5)
	respond.Error(w, http.StatusServiceUnavailable, v1alpha1.ErrorTemporarilyUnavailable,
		"the session store is unavailable; try again shortly")
}

// deliveryError answers a poll whose delivery could not be recorded (the
// mark on the provider cluster, or the first delivery's record): nothing
// was handed out, so 503 and the client polls again.
func (s *server) deliveryError(w http.ResponseWriter, sess lifecycle.Session, err error) {
	outcome := "unavailable"
	switch {
	case errors.Is(err, sessions.ErrUnavailable):
		s.log.Warn("the delivery of a response could not be recorded; not handed out", "session", sess.ID, "error", err)
	case errors.Is(err, context.Canceled):
		s.log.Info("poll ended before its delivery was recorded; not handed out", "session", sess.ID, "error", err)
		outcome = "canceled"
	default:
		s.log.Error("recording the delivery of a response failed; not handed out", "session", sess.ID, "error", err)
	}
	s.metrics.poll(outcome)
	respond.RetryAfter(w.Header(), 5)
	respond.Error(w, http.StatusServiceUnavailable, v1alpha1.ErrorTemporarilyUnavailable,
		"the delivery of the binding response could not be recorded; try again shortly")
}
