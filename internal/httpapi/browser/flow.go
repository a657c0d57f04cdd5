package browser

import (
	"encoding/json"
	"errors"
	"net/url"
	"slices"

	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/protocol"
)

// clusterKind says how a login's cluster ID was settled at /authorize.
type clusterKind string

const (
	// clusterNew: the backend issued the ID to this session (none presented).
	clusterNew clusterKind = "new"
	// clusterProven: the session presented an ID and the link proved it
	// (protocol.ProofParam).
	clusterProven clusterKind = "proven"
	// clusterReplaced: the session presented an ID the link did not prove;
	// the bind gets a new ID instead, never the presented one's namespace.
	clusterReplaced clusterKind = "replaced"
	// clusterCallback: the released CLI's ID from the callback flow's c
	// (or, in the v1alpha2 browser flow, consumer_id), honoured without a
	// proof: the result goes to this browser's own machine.
	clusterCallback clusterKind = "callback"
	// clusterNone: the CLI login, which binds nothing.
	clusterNone clusterKind = "none"
	// clusterPickup: kbind v2's browser flow, begun on the provider's
	// page: a new ID issued to the session, no link, no callback.
	clusterPickup clusterKind = "pickup"
)

// flow is what the login at the identity provider carries (signed,
// readable, at most 1 KiB) from /authorize to /callback, and the login
// cookie from there to the bind: the session, the cluster ID the bind will
// use and how it was settled, the poll flow's link nonce and the callback
// flow's destination.
type flow struct {
	SessionID   string      `json:"s"`
	ClusterID   string      `json:"c"`
	ClusterKind clusterKind `json:"ck"`
	// LinkNonce is the nonce of the poll flow's authorize link, spent
	// at the callback once the user signed in, not when the link is
	// opened: a stranger opening links writes nothing.
	LinkNonce string `json:"n,omitempty"`
	// CallbackURL and CLISessionID: the callback flow's only.
	CallbackURL  string `json:"cb,omitempty"`
	CLISessionID string `json:"cs,omitempty"`
}

func (f flow) encode() []byte {
	b, _ := json.Marshal(f)
	return b
}

func parseFlow(state []byte) (flow, bool) {
	var f flow
	if json.Unmarshal(state, &f) != nil || f.SessionID == "" {
		return flow{}, false
	}
	switch f.ClusterKind {
	case clusterNew, clusterProven, clusterReplaced:
		return f, f.ClusterID != "" && f.LinkNonce != "" && f.CallbackURL == "" && f.CLISessionID == ""
	case clusterCallback:
		return f, f.ClusterID != "" && f.LinkNonce == "" && f.CallbackURL != "" && f.CLISessionID != ""
	case clusterNone:
		return f, f.ClusterID == "" && f.LinkNonce == "" && f.CallbackURL != "" && f.CLISessionID != ""
	case clusterPickup:
		return f, f.ClusterID != "" && f.LinkNonce == "" && f.CallbackURL == "" && f.CLISessionID == ""
	}
	return flow{}, false
}

// errFlowMismatch: a flow state whose session is of another flow than
// its cluster kind says (only a bug of ours makes one: states are signed).
var errFlowMismatch = errors.New("the login state does not fit its session's flow")

// session opens the flow's session: the ID checked by its keys (never
// trusted from the state alone), the callback fields from the flow, which
// must fit the session's flow.
func (h *Handler) session(f flow) (lifecycle.Session, error) {
	sess, err := h.svc.Open(f.SessionID)
	if err != nil {
		return sess, err
	}
	var want []clusterKind
	switch sess.Flow {
	case sessionkey.FlowPoll, sessionkey.FlowPollV1alpha2:
		want = []clusterKind{clusterNew, clusterProven, clusterReplaced}
	case sessionkey.FlowCallback, sessionkey.FlowBrowserV1alpha2:
		want = []clusterKind{clusterCallback}
	case sessionkey.FlowCLILogin:
		want = []clusterKind{clusterNone}
	case sessionkey.FlowBrowserV2:
		want = []clusterKind{clusterPickup}
	}
	if !slices.Contains(want, f.ClusterKind) {
		return lifecycle.Session{}, errFlowMismatch
	}
	sess.CallbackURL, sess.CallbackSessionID = f.CallbackURL, f.CLISessionID
	return sess, nil
}

// pollCluster settles the cluster ID of a poll-flow session for the link
// q: the one issued to the session needs no proof; a presented one is
// honoured only with the proof of its cluster secret for this very session
// (a proof from another session, or made without the secret, fails), and
// is otherwise replaced by a new ID, so that a link made by someone else
// can never reach an existing namespace.
func (h *Handler) pollCluster(sess lifecycle.Session, q url.Values) (string, clusterKind) {
	proof, _ := protocol.Single(q, protocol.ProofParam)
	id, proven := h.svc.SettleCluster(sess, proof)
	switch {
	case sess.ClusterID == "":
		return id, clusterNew
	case proven:
		return id, clusterProven
	}
	h.log.Info("the link presents a cluster ID without a valid proof; the bind gets a new cluster ID",
		"session", sess.ID, "presented", sess.ClusterID, "proof", q.Has(protocol.ProofParam))
	return id, clusterReplaced
}
