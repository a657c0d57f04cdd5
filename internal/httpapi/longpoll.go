package httpapi

import (
	"net/http"

	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// longPoll holds a poll of a pending session that asks to wait (Prefer:
// wait=N) until the session ends, the wait is over, or shutdown begins,
// and returns the session to answer with. A poll that does not ask, or
// that finds every slot taken, is answered at once with pending, as are
// polls whose wait fails: the client's next poll finds out more.
func (s *server) longPoll(w http.ResponseWriter, r *http.Request, sess lifecycle.Session, pending sessions.Outcome) sessions.Outcome {
	d, ok := s.cfg.LongPoll.Wanted(r.Header)
	if !ok {
		return pending
	}
	ctx, done, ok := s.cfg.LongPoll.Hold(r.Context(), d)
	if !ok {
		return pending
	}
	defer done()
	w.Header().Set("Preference-Applied", longpoll.Applied(d))
	outcome, err := s.bind.Wait(ctx, sess)
	if err != nil {
		s.log.Info("long poll ended without news; answering pending", "session", sess.ID, "error", err)
		return pending
	}
	return outcome
}
