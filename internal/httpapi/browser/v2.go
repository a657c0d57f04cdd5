package browser

import (
	"net/http"
	"net/url"

	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// PathV2Pickup is where a kbind v2 bundle is picked up, below the
// external URL's path (served by internal/httpapi/kbindv2).
const PathV2Pickup = "/v2/pickup"

// BeginV2 starts the browser flow of a kbind v2 consumer, who begins on
// the provider's own page: a session (derived, stored nowhere) with a
// new cluster ID, then the login. A HEAD creates nothing.
func (h *Handler) BeginV2(w http.ResponseWriter, r *http.Request) {
	if !h.svc.CanBind(sessionkey.FlowBrowserV2) {
		w.Header().Set("Retry-After", "30")
		h.page(w, http.StatusServiceUnavailable, pageIdPDown, "")
		return
	}
	if r.Method == http.MethodHead {
		linkLooksGood(w)
		return
	}
	sess, clusterID, _ := h.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowBrowserV2})
	h.beginLogin(w, r, flow{SessionID: sess.ID, ClusterID: clusterID, ClusterKind: clusterPickup}.encode())
}

// pickupURL is the single-use URL of sess's bundle: the session ID and
// the pickup secret (lifecycle.PickupSecret) in the query.
func (h *Handler) pickupURL(sess lifecycle.Session) string {
	q := url.Values{}
	q.Set("s", sess.ID)
	q.Set("k", lifecycle.PickupSecret(sess))
	return h.cfg.ExternalURL.Scheme + "://" + h.cfg.ExternalURL.Host + h.path(PathV2Pickup) + "?" + q.Encode()
}
