package lifecycle

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// The pickup of a recorded outcome that no client polls for (kbind v2's
// browser flow, docs/v2.md §5): the done page shows a URL with the
// session ID and a secret derived from the session's own secret, which
// only the backend's keys can compute; the first pickup with it spends a
// single-use mark in the store, so that it works once across replicas
// and restarts.

var (
	// ErrPickupDenied: the secret is not the session's, or the session
	// is not of a flow that is picked up.
	ErrPickupDenied = errors.New("not a pickup URL of this backend")
	// ErrPickupUsed: the bundle was picked up before.
	ErrPickupUsed = errors.New("this pickup URL was used already; bind again for a new one")
	// ErrPickupPending: nothing was bound yet in the session.
	ErrPickupPending = errors.New("nothing to pick up yet: finish the binding in the browser first")
)

// PickupDeniedError: the session was denied; Reason says why.
type PickupDeniedError struct{ Reason string }

func (e *PickupDeniedError) Error() string { return "the binding was refused: " + e.Reason }

// PickupSecret is the secret of sess's pickup URL: 256 bits, base64url
// without padding.
func PickupSecret(sess Session) string {
	m := hmac.New(sha256.New, []byte(sess.Secret))
	m.Write([]byte("kbind-v2-pickup"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Pickup hands out the recorded outcome of sess once, for secret: it
// checks the secret in constant time, marks the binding delivered (as a
// poll does, see Deliver), spends the pickup's single-use mark and
// returns the response. ErrPickupDenied, ErrPickupPending, a
// *PickupDeniedError, ErrPickupUsed (also once the grace period after
// the first pickup is over), ErrBindingGone, or an error of the store or
// the provider cluster (errors.Is sessions.ErrUnavailable: try again).
func (s *Service) Pickup(ctx context.Context, sess Session, secret string) ([]byte, error) {
	want := PickupSecret(sess)
	if sess.Flow != sessionkey.FlowBrowserV2 || !hmac.Equal([]byte(secret), []byte(want)) {
		return nil, ErrPickupDenied
	}
	o, err := s.cfg.Store.Outcome(ctx, sess.ID)
	if err != nil {
		return nil, err
	}
	switch o.State {
	case sessions.StatePending:
		return nil, ErrPickupPending
	case sessions.StateDenied:
		return nil, &PickupDeniedError{Reason: o.DenyReason}
	}
	// The delivery first: a pickup refused for a transient failure here
	// has spent nothing and may be tried again.
	switch err := s.Deliver(ctx, sess, o); {
	case errors.Is(err, ErrDelivered):
		return nil, ErrPickupUsed
	case err != nil:
		return nil, err
	}
	switch err := s.cfg.Store.UseOnce(ctx, "pickup\n"+sess.ID, sess.ExpiresAt); {
	case errors.Is(err, sessions.ErrNonceUsed):
		return nil, ErrPickupUsed
	case err != nil:
		return nil, fmt.Errorf("spending the pickup: %w", err)
	}
	return o.Response, nil
}
