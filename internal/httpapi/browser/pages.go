package browser

import (
	"context"
	"errors"
	"net/http"

	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/web"
)

// pageKind names each error page; its words are in errorPages.
type pageKind int

const (
	pageBadLink pageKind = iota
	pageBadSignature
	pageLinkUsed
	pageExpired
	pageUnknownSession
	pageBadCallback
	pageIdPDown
	pageLoginState
	pageLoginExpired
	pageDenied
	pageLoginFailed
	pageIdPRetry
	pageNotLoggedIn
	pageOtherSession
	pageCrossSite
	pageBadForm
	pageProvisionFailed
	pageAlreadyDone
	pageMethodNotAllowed
	pageInternal
	pageUnavailable
	pageNoCallbackFlow
	pageLoginUnavailable
)

const runAgain = "Run the bind command in your terminal again; it prints a new link."

var errorPages = map[pageKind]web.ErrorPage{
	pageBadLink:          {Title: "This link is incomplete", Message: "The link does not have the parts a binding link needs.", Hint: "Copy the whole link from your terminal. " + runAgain},
	pageBadSignature:     {Title: "This link is not valid", Message: "The link's signature does not match. It may have been changed or cut short.", Hint: "Copy the whole link from your terminal, or " + lowerFirst(runAgain)},
	pageLinkUsed:         {Title: "This link was already used", Message: "Each link works once, so that nobody else can reuse it.", Hint: runAgain},
	pageExpired:          {Title: "This link has expired", Message: "The binding session has ended or is not known here.", Hint: runAgain},
	pageUnknownSession:   {Title: "This link is not known", Message: "No binding session with this link exists here. The link may be cut short or meant for another provider.", Hint: "Copy the whole link from your terminal, or " + lowerFirst(runAgain)},
	pageBadCallback:      {Title: "This link cannot be used", Message: "The link asks to send the result somewhere this provider does not allow.", Hint: "Use a kube-bind command on your own computer. " + runAgain},
	pageIdPDown:          {Title: "Sign-in is not available right now", Message: "The provider cannot reach its identity provider at the moment.", Hint: "Wait a minute, then run the bind command again."},
	pageLoginState:       {Title: "This sign-in cannot be finished", Message: "The sign-in was not started in this browser, or it was already finished.", Hint: runAgain},
	pageLoginExpired:     {Title: "The sign-in took too long", Message: "The sign-in at the identity provider expired.", Hint: runAgain},
	pageDenied:           {Title: "Access denied", Message: "The binding was refused.", Hint: "Ask the provider for access if you think you should have it."},
	pageLoginFailed:      {Title: "Sign-in failed", Message: "The sign-in at the identity provider did not complete.", Hint: runAgain},
	pageNotLoggedIn:      {Title: "You are not signed in", Message: "This browser has no sign-in for a binding, or it has expired.", Hint: runAgain},
	pageOtherSession:     {Title: "Another binding is open in this browser", Message: "This page belongs to a binding other than the one this browser signed in for last.", Hint: runAgain},
	pageCrossSite:        {Title: "Request refused", Message: "The form did not come from this provider's page.", Hint: "Reload the page and submit it again, or " + lowerFirst(runAgain)},
	pageBadForm:          {Title: "The form could not be read", Message: "The submitted form is not valid.", Hint: "Go back, pick the APIs again and submit."},
	pageProvisionFailed:  {Title: "The binding could not be set up", Message: "The provider could not prepare your access. Nothing you did caused this.", Hint: "Go back and press Bind again in a moment. If it keeps failing, contact the provider."},
	pageAlreadyDone:      {Title: "Already bound", Message: "This binding session is already complete.", Hint: "Go back to your terminal. To bind more APIs, run the bind command again."},
	pageMethodNotAllowed: {Title: "Request not allowed here", Message: "This page does not take this kind of request.", Hint: "Start from the link your terminal printed."},
	pageInternal:         {Title: "Something went wrong", Message: "The provider hit an internal error.", Hint: "Try again in a moment. If it keeps failing, contact the provider."},
	pageUnavailable:      {Title: "Please try again in a moment", Message: "The provider is briefly unable to reach its cluster. Your binding session is not lost.", Hint: "Reload this page in a few seconds."},
	pageLoginUnavailable: {Title: "Please try again in a moment", Message: "The provider is briefly unable to record your sign-in. Your binding session is not lost.", Hint: "In a few seconds, open the link from your terminal again."},
	pageNoCallbackFlow:   {Title: "This provider binds with the poll flow only", Message: "The link comes from a client that uses the callback flow (OAuth2CodeGrant), which this provider has turned off.", Hint: "Bind with kube-bind-poll, or another client that supports OAuth2CodeGrantPoll."},
}

// page renders the error page of kind; detail, if any, replaces its
// message with what exactly was wrong.
func (h *Handler) page(w http.ResponseWriter, status int, kind pageKind, detail string) {
	p := errorPages[kind]
	p.ProviderName = h.cfg.ProviderName
	if detail != "" {
		p.Message = p.Message + " (" + detail + ")"
	}
	web.RenderError(w, status, p)
}

// storeFailed renders the answer to a failed session store operation:
// a lookup, a nonce, or the Complete or Deny of a bind.
func (h *Handler) storeFailed(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, sessions.ErrNotPending):
		h.page(w, http.StatusConflict, pageAlreadyDone, "")
	case errors.Is(err, sessions.ErrUnavailable):
		// Transient (the provider cluster briefly unreachable), not the
		// end of the session: say so, and come back.
		h.log.Warn("session store briefly unavailable", "error", err)
		w.Header().Set("Retry-After", "5")
		h.page(w, http.StatusServiceUnavailable, pageUnavailable, "")
	case errors.Is(err, context.Canceled):
		// The browser left, or the server is stopping.
		h.log.Info("request ended before the session store answered", "error", err)
		w.Header().Set("Retry-After", "5")
		h.page(w, http.StatusServiceUnavailable, pageUnavailable, "")
	default:
		h.log.Error("session store failed", "error", err)
		w.Header().Set("Retry-After", "10")
		h.page(w, http.StatusServiceUnavailable, pageInternal, "")
	}
}

// loginStoreFailed renders the answer to a callback whose login could
// not be recorded: the code is spent, so the user starts over from the
// link (which is not spent either), once the store answers again.
func (h *Handler) loginStoreFailed(w http.ResponseWriter, err error) {
	if !errors.Is(err, sessions.ErrUnavailable) {
		h.storeFailed(w, err)
		return
	}
	h.log.Warn("session store briefly unavailable; the login is not recorded", "error", err)
	w.Header().Set("Retry-After", "5")
	h.page(w, http.StatusServiceUnavailable, pageLoginUnavailable, "")
}

// loginStateFailed renders the answer to a callback whose state is not
// genuine, not this browser's, used or expired, or could not be spent.
func (h *Handler) loginStateFailed(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, sessions.ErrUnavailable):
		h.loginStoreFailed(w, err)
	case errors.Is(err, oidc.ErrNotReady):
		w.Header().Set("Retry-After", "30")
		h.page(w, http.StatusServiceUnavailable, pageIdPDown, "")
	case errors.Is(err, oidc.ErrStateExpired):
		h.page(w, http.StatusGone, pageLoginExpired, "")
	default:
		h.log.Info("login callback refused", "error", err)
		h.page(w, http.StatusBadRequest, pageLoginState, "")
	}
}

func (h *Handler) internalError(w http.ResponseWriter, doing string, err error) {
	h.log.Error("internal error", "doing", doing, "error", err)
	h.page(w, http.StatusInternalServerError, pageInternal, "")
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]|0x20) + s[1:]
}
