package pollclient

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// readBody reads at most limit bytes of r's body and closes it; a longer
// body is an error rather than a memory hazard.
func readBody(r *http.Response, limit int64) ([]byte, error) {
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge{limit}
	}
	return b, nil
}

type errTooLarge struct{ limit int64 }

func (e errTooLarge) Error() string {
	return fmt.Sprintf("answer is larger than %d bytes", e.limit)
}

// decodeJSON decodes one JSON value from b into v, insisting on a JSON
// content type where the server named one.
func decodeJSON(r *http.Response, b []byte, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return fmt.Errorf("%w: content type %q is not JSON", ErrInvalidResponse, ct)
		}
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidResponse, err)
	}
	return nil
}

// errorBody decodes a JSON error body; anything else yields an empty one,
// so that the status alone decides.
func errorBody(b []byte) v1alpha1.Error {
	var e v1alpha1.Error
	if json.Unmarshal(b, &e) != nil {
		return v1alpha1.Error{}
	}
	const maxMessage = 1024 // keep a hostile message from flooding a terminal
	if len(e.Message) > maxMessage {
		e.Message = e.Message[:maxMessage] + "…"
	}
	return e
}

// maxRetryAfter caps what a provider can make a client wait, in either
// form of Retry-After (a date far ahead is as absurd as a huge number).
const maxRetryAfter = 24 * time.Hour

// retryAfter parses a Retry-After header: delay seconds or an HTTP date.
// ok is false when the header is absent or unreadable.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter), true
	}
	return 0, false
}
