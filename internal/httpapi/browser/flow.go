package browser

import (
	"context"
	"net/url"
	"strings"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/pkg/bindproof"
)

// clusterKind says how a login's cluster ID was settled at /authorize.
type clusterKind string

const (
	// clusterNew: the backend issued the ID to this session (none presented).
	clusterNew clusterKind = "new"
	// clusterProven: the session presented an ID and the link proved it
	// (bindproof.ProofParam).
	clusterProven clusterKind = "proven"
	// clusterReplaced: the session presented an ID the link did not prove;
	// the bind gets a new ID instead, never the presented one's namespace.
	clusterReplaced clusterKind = "replaced"
	// clusterCallback: the released CLI's ID from the callback flow's c,
	// honoured as before: the result goes to this browser's own machine.
	clusterCallback clusterKind = "callback"
)

// flowState is what the login at the identity provider carries (signed,
// readable, at most 1 KiB) from /authorize to /callback: the session ID,
// the cluster ID the bind will use and how it was settled, separated by
// spaces (none of the three ever contains one).
func flowState(sid, clusterID string, kind clusterKind) []byte {
	return []byte(sid + " " + clusterID + " " + string(kind))
}

// FlowSessionID returns the session ID of a flow state made by this
// package, for callers that key per-session data on it (the single-use
// record of login states).
func FlowSessionID(state []byte) string {
	sid, _, _ := strings.Cut(string(state), " ")
	return sid
}

// StateOnce is the oidc.Config.UseOnce of the browser login: a login state
// is single-use across replicas because the session store remembers it
// like a nonce of the session its flow state belongs to.
func StateOnce(store sessions.Store) func(ctx context.Context, flowState []byte, key string) error {
	return func(ctx context.Context, flowState []byte, key string) error {
		return store.UseNonce(ctx, FlowSessionID(flowState), "oidc-state:"+key)
	}
}

func parseFlowState(state []byte) (sid, clusterID string, kind clusterKind, ok bool) {
	parts := strings.Split(string(state), " ")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return "", "", "", false
	}
	switch k := clusterKind(parts[2]); k {
	case clusterNew, clusterProven, clusterReplaced, clusterCallback:
		return parts[0], parts[1], k, true
	}
	return "", "", "", false
}

// pollCluster settles the cluster ID of a poll-flow session for the link
// q: the one issued to the session needs no proof; a presented one is
// honoured only with the proof of its cluster secret for this very session
// (a proof from another session, or made without the secret, fails), and
// is otherwise replaced by a new ID, so that a link made by someone else
// can never reach an existing namespace.
func (h *Handler) pollCluster(sess sessions.Session, q url.Values) (string, clusterKind) {
	if h.cfg.ClusterKey.Issued(sess.ID, sess.ClusterID) {
		return sess.ClusterID, clusterNew
	}
	if proof, ok := single(q, bindproof.ProofParam); ok && h.cfg.ClusterKey.Proven(sess.ID, sess.ClusterID, proof) {
		return sess.ClusterID, clusterProven
	}
	h.log.Info("the link presents a cluster ID without a valid proof; the bind gets a new cluster ID",
		"session", sess.ID, "presented", sess.ClusterID, "proof", q.Has(bindproof.ProofParam))
	return h.cfg.ClusterKey.NewClusterID(sess.ID), clusterReplaced
}
