package browser

import (
	"testing"
)

func TestFlowStateRoundTrip(t *testing.T) {
	for _, k := range []clusterKind{clusterNew, clusterProven, clusterReplaced, clusterCallback} {
		state := flowState("sid-1", "cluster-1", k)
		sid, cid, kind, ok := parseFlowState(state)
		if !ok || sid != "sid-1" || cid != "cluster-1" || kind != k || FlowSessionID(state) != "sid-1" {
			t.Errorf("%s: parsed %q %q %q %v", k, sid, cid, kind, ok)
		}
	}
	// A state of the previous format (the bare session ID) or another kind
	// is refused, not guessed at.
	for _, bad := range []string{"sid-1", "sid-1 cluster-1", "sid-1 cluster-1 other", " c new", "s  new", "s c new x"} {
		if _, _, _, ok := parseFlowState([]byte(bad)); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The flow state is signed by the backend, but its parser still must not
// fail on anything: it only ever returns ok for what flowState makes.
func FuzzParseFlowState(f *testing.F) {
	f.Add([]byte("sid cluster new"))
	f.Add([]byte("sid"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sid, cid, kind, ok := parseFlowState(b)
		if ok && string(flowState(sid, cid, kind)) != string(b) {
			t.Fatalf("%q parsed to %q %q %q, which does not make it again", b, sid, cid, kind)
		}
	})
}
