package pollclient

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Errors that end a flow; match them with errors.Is.
var (
	// ErrAccessDenied: the user cancelled, or the provider refused the user.
	ErrAccessDenied = errors.New("access denied")
	// ErrInvalidSignature: the provider refused a request's signature or
	// nonce. Start over with a new session.
	ErrInvalidSignature = errors.New("invalid signature")
	// ErrExpired: the session expired or the provider does not know it.
	// Start over with a new session.
	ErrExpired = errors.New("session expired")
	// ErrInvalidRequest: the provider called a request malformed.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrNoPollMethod: the provider offers only the callback flow.
	ErrNoPollMethod = errors.New("provider does not offer the OAuth2CodeGrantPoll method")
	// ErrNoCodeGrantMethod: the provider does not offer the callback flow.
	ErrNoCodeGrantMethod = errors.New("provider does not offer the OAuth2CodeGrant method")
	// ErrUnsupportedProvider: the discovery document is not one this client
	// speaks (apiVersion, version, malformed URLs or interval).
	ErrUnsupportedProvider = errors.New("unsupported provider")
	// ErrInvalidResponse: an answer of the provider is malformed, or the
	// BindingResponse fails validation.
	ErrInvalidResponse = errors.New("invalid response from provider")
	// ErrUnavailable: the provider kept answering with server errors or
	// could not be reached.
	ErrUnavailable = errors.New("provider unavailable")
)

// ServerError is a JSON error answer of the provider. errors.Is matches it
// against the sentinel its code maps to (ErrAccessDenied for access_denied,
// and so on).
type ServerError struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Code is the body's "error" field; empty when the body had none.
	Code string
	// Message is the body's "message" field, the provider's words.
	Message string
	kind    error
}

func (e *ServerError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	if e.Code != "" {
		return fmt.Sprintf("%v: %s (HTTP %d, %s)", e.kind, msg, e.StatusCode, e.Code)
	}
	return fmt.Sprintf("%v: %s (HTTP %d)", e.kind, msg, e.StatusCode)
}

// Unwrap returns the sentinel error of the answer's code.
func (e *ServerError) Unwrap() error { return e.kind }

// newServerError maps an error answer to its sentinel. The code decides
// where there is one; the status otherwise.
func newServerError(status int, body v1alpha1.Error) *ServerError {
	e := &ServerError{StatusCode: status, Code: body.Error, Message: body.Message}
	switch body.Error {
	case v1alpha1.ErrorAccessDenied:
		e.kind = ErrAccessDenied
	case v1alpha1.ErrorInvalidSignature:
		e.kind = ErrInvalidSignature
	case v1alpha1.ErrorExpiredToken:
		e.kind = ErrExpired
	case v1alpha1.ErrorInvalidRequest, v1alpha1.ErrorRequestTooLarge:
		e.kind = ErrInvalidRequest
	default:
		switch {
		case status == http.StatusUnauthorized:
			e.kind = ErrInvalidSignature
		case status == http.StatusGone, status == http.StatusNotFound:
			e.kind = ErrExpired
		case status >= 500:
			e.kind = ErrUnavailable
		case status == http.StatusBadRequest, status == http.StatusRequestEntityTooLarge:
			e.kind = ErrInvalidRequest
		default:
			e.kind = ErrInvalidResponse
		}
	}
	return e
}
