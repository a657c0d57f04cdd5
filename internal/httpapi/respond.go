package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Header values shared by all answers. They are assigned to the header map
// directly (never modified afterwards) so that the hot poll path does not
// allocate a slice per header.
var (
	hdrJSON    = []string{"application/json; charset=utf-8"}
	hdrText    = []string{"text/plain; charset=utf-8"}
	hdrNoStore = []string{"no-store"}
	// hdrHSTS pins HTTPS for a year, this host only.
	hdrHSTS      = []string{"max-age=31536000"}
	hdrNoSniff   = []string{"nosniff"}
	retryAfterS  = [...][]string{{"0"}, {"1"}, {"2"}, {"3"}, {"4"}, {"5"}, {"6"}, {"7"}, {"8"}, {"9"}, {"10"}}
	hdrRetry30   = []string{"30"}
	hdrRetry5    = retryAfterS[5]
	retryAfterKy = "Retry-After"
)

// Error codes of this backend beyond the protocol's.
const (
	errNotFound         = "not_found"
	errMethodNotAllowed = "method_not_allowed"
	errInternal         = "internal_error"
)

func setJSONHeaders(h http.Header) {
	h["Content-Type"] = hdrJSON
	h["X-Content-Type-Options"] = hdrNoSniff
}

// retryAfter sets Retry-After to d in whole seconds, rounded up, at least 1.
func retryAfter(h http.Header, seconds int64) {
	if seconds < 1 {
		seconds = 1
	}
	if seconds < int64(len(retryAfterS)) {
		h[retryAfterKy] = retryAfterS[seconds]
		return
	}
	h[retryAfterKy] = []string{strconv.FormatInt(seconds, 10)}
}

// writeJSONBytes answers status with body, which is JSON.
func writeJSONBytes(w http.ResponseWriter, status int, body []byte) {
	setJSONHeaders(w.Header())
	w.WriteHeader(status)
	w.Write(body)
}

// writeError answers status with the JSON error body {error, message}.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSONBytes(w, status, errorBody(code, message))
}

func errorBody(code, message string) []byte {
	b, err := json.Marshal(v1alpha1.Error{Error: code, Message: message})
	if err != nil { // cannot happen for two strings
		panic(err)
	}
	return append(b, '\n')
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, errInternal, "the answer could not be encoded")
		return
	}
	writeJSONBytes(w, status, append(b, '\n'))
}
