package browser

import (
	"testing"
)

// validFlows are flows /authorize makes: one of each cluster kind.
var validFlows = []flow{
	{SessionID: "sid-1", ClusterID: "cluster-1", ClusterKind: clusterNew, LinkNonce: "n-1"},
	{SessionID: "sid-1", ClusterID: "cluster-1", ClusterKind: clusterProven, LinkNonce: "n-1"},
	{SessionID: "sid-1", ClusterID: "cluster-1", ClusterKind: clusterReplaced, LinkNonce: "n-1"},
	{SessionID: "sid-1", ClusterID: "aB3dE9", ClusterKind: clusterCallback, CallbackURL: "http://localhost:41234/callback", CLISessionID: "cli-1"},
	{SessionID: "sid-1", ClusterID: "", ClusterKind: clusterNone, CallbackURL: "http://127.0.0.1:41234/callback", CLISessionID: "cli-1"},
	{SessionID: "sid-1", ClusterID: "cluster-1", ClusterKind: clusterPickup},
}

func TestFlowStateRoundTrip(t *testing.T) {
	for _, f := range validFlows {
		got, ok := parseFlow(f.encode())
		if !ok || got != f {
			t.Errorf("%+v: parsed %+v %v", f, got, ok)
		}
	}
	// A state of a previous format (the bare session ID, or the words of
	// the format before JSON), an incomplete one, another kind, or
	// callback fields where they do not belong is refused, not guessed at.
	for _, bad := range []string{
		"sid-1", "sid-1 cluster-1 new", "", "null", "{}", "[]", `"sid-1"`,
		`{"s":"sid-1","c":"cluster-1"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"other"}`,
		`{"s":"","c":"cluster-1","ck":"new"}`,
		`{"s":"sid-1","c":"","ck":"new"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"new","cb":"http://localhost:1/callback"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"proven","cs":"cli-1"}`,
		`{"s":"sid-1","c":"aB3dE9","ck":"callback"}`,
		`{"s":"sid-1","c":"aB3dE9","ck":"callback","cb":"http://localhost:1/callback"}`,
		`{"s":"sid-1","c":"aB3dE9","ck":"callback","cs":"cli-1"}`,
		`{"s":"sid-1","c":"aB3dE9","ck":"none","cb":"http://127.0.0.1:1/callback","cs":"cli-1"}`,
		`{"s":"sid-1","c":"","ck":"none","cs":"cli-1"}`,
		`{"s":"sid-1","c":"","ck":"none","cb":"http://127.0.0.1:1/callback"}`,
		`{"s":1,"c":"cluster-1","ck":"new"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"new"}`,
		`{"s":"sid-1","c":"aB3dE9","ck":"callback","n":"n-1","cb":"http://localhost:1/callback","cs":"cli-1"}`,
		`{"s":"sid-1","c":"","ck":"none","n":"n-1","cb":"http://127.0.0.1:1/callback","cs":"cli-1"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"new"} trailing`,
		`{"s":"sid-1","c":"","ck":"pickup"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"pickup","n":"n-1"}`,
		`{"s":"sid-1","c":"cluster-1","ck":"pickup","cb":"http://localhost:1/callback","cs":"cli-1"}`,
	} {
		if f, ok := parseFlow([]byte(bad)); ok {
			t.Errorf("%q accepted as %+v", bad, f)
		}
	}
}

// FuzzParseFlowState: the flow state is signed by the backend (the login
// state, the login cookie), but its parser still must not fail on
// anything, and it accepts only complete flows: a session, a cluster ID,
// a known kind, and the callback fields exactly for the callback kind;
// what it accepts encodes to a state that parses to the same flow.
func FuzzParseFlowState(f *testing.F) {
	for _, fl := range validFlows {
		f.Add(fl.encode())
	}
	f.Add([]byte("sid cluster new"))
	f.Add([]byte("sid"))
	f.Add([]byte(`{"s":"sid-1","c":"cluster-1","ck":"new","cb":"x"}`))
	f.Add([]byte(`{"S":"sid-1","C":"cluster-1","CK":"new"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, ok := parseFlow(b)
		if !ok {
			return
		}
		if fl.SessionID == "" || (fl.ClusterID == "") != (fl.ClusterKind == clusterNone) {
			t.Fatalf("%q parsed to %+v, without a session, or with a cluster exactly when it binds none", b, fl)
		}
		callbackFields := fl.CallbackURL != "" || fl.CLISessionID != ""
		switch fl.ClusterKind {
		case clusterNew, clusterProven, clusterReplaced:
			if callbackFields || fl.LinkNonce == "" {
				t.Fatalf("%q parsed to a poll-flow %+v with callback fields or without its link's nonce", b, fl)
			}
		case clusterCallback, clusterNone:
			if fl.CallbackURL == "" || fl.CLISessionID == "" || fl.LinkNonce != "" {
				t.Fatalf("%q parsed to a callback flow %+v without its callback, or with a link nonce", b, fl)
			}
		case clusterPickup:
			if callbackFields || fl.LinkNonce != "" {
				t.Fatalf("%q parsed to a pickup flow %+v with callback fields or a link nonce", b, fl)
			}
		default:
			t.Fatalf("%q parsed to kind %q", b, fl.ClusterKind)
		}
		if again, ok := parseFlow(fl.encode()); !ok || again != fl {
			t.Fatalf("%q parsed to %+v, whose encoding parses to %+v %v", b, fl, again, ok)
		}
	})
}
