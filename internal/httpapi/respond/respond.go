// Package respond writes the answers of the v1alpha1 protocol's JSON
// API (docs/protocol.md): its error body, Retry-After, and bounded
// request bodies. internal/httpapi and the parts that answer in that
// format share it.
package respond

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Header values shared by all answers. They are assigned to the header map
// directly (never modified afterwards) so that the hot poll path does not
// allocate a slice per header.
var (
	hdrJSON      = []string{"application/json; charset=utf-8"}
	hdrNoSniff   = []string{"nosniff"}
	retryAfterS  = [...][]string{{"0"}, {"1"}, {"2"}, {"3"}, {"4"}, {"5"}, {"6"}, {"7"}, {"8"}, {"9"}, {"10"}}
	retryAfterKy = "Retry-After"
)

// Error codes of this backend beyond the protocol's.
const (
	ErrNotFound         = "not_found"
	ErrMethodNotAllowed = "method_not_allowed"
	ErrInternal         = "internal_error"
	ErrRequestTooLarge  = "request_too_large"
)

// RetryAfter sets Retry-After to seconds, at least 1.
func RetryAfter(h http.Header, seconds int64) {
	if seconds < 1 {
		seconds = 1
	}
	if seconds < int64(len(retryAfterS)) {
		h[retryAfterKy] = retryAfterS[seconds]
		return
	}
	h[retryAfterKy] = []string{strconv.FormatInt(seconds, 10)}
}

// CeilSeconds rounds d up to whole seconds, at least 1.
func CeilSeconds(d time.Duration) int64 {
	sec := int64((d + time.Second - 1) / time.Second)
	return max(sec, 1)
}

// JSONBytes answers status with body, which is JSON.
func JSONBytes(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h["X-Content-Type-Options"] = hdrNoSniff
	w.WriteHeader(status)
	w.Write(body)
}

// Text answers status with body of contentType (not HTML: a browser
// must never run what it holds, so sniffing is off).
func Text(w http.ResponseWriter, status int, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h["X-Content-Type-Options"] = hdrNoSniff
	w.WriteHeader(status)
	w.Write(body)
}

// JSON answers status with v encoded.
func JSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		Error(w, http.StatusInternalServerError, ErrInternal, "the answer could not be encoded")
		return
	}
	JSONBytes(w, status, append(b, '\n'))
}

// Error answers status with the JSON error body {error, message}.
func Error(w http.ResponseWriter, status int, code, message string) {
	JSONBytes(w, status, ErrorBody(code, message))
}

// ErrorBody is the JSON error body {error, message}.
func ErrorBody(code, message string) []byte {
	b, err := json.Marshal(v1alpha1.Error{Error: code, Message: message})
	if err != nil { // cannot happen for two strings
		panic(err)
	}
	return append(b, '\n')
}

// TooLargeMessage says a body is over limit bytes.
func TooLargeMessage(limit int) string {
	return "the request body is larger than the limit of " + strconv.Itoa(limit) + " bytes"
}

// ReadBody reads at most limit bytes of r's body. It reports tooLarge when
// the body is longer.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if r.ContentLength > limit {
		return nil, true, nil
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, true, nil
		}
		return nil, false, err
	}
	return body, false, nil
}
