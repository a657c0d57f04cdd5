package oidc

import "testing"

// The re-check of a recorded identity: a group that admitted the user
// still counts only while listed; unknown groups keep a binding only
// while a group list could have admitted it.
func TestAllowsRecorded(t *testing.T) {
	l := AllowList{Users: []string{"bob", "eve@example.com"}, Groups: []string{"team-b"}}
	for _, c := range []struct {
		id          Identity
		groupsKnown bool
		want        bool
	}{
		{Identity{Subject: "bob"}, true, true},
		{Identity{Subject: "carol", Groups: []string{"team-a"}}, true, false},
		{Identity{Subject: "dave", Groups: []string{"team-b"}}, true, true},
		{Identity{Subject: "x", Email: "eve@example.com", EmailVerified: true}, true, true},
		{Identity{Subject: "x", Email: "eve@example.com"}, true, false},
		{Identity{Subject: "carol"}, false, true},
	} {
		if got := l.AllowsRecorded(c.id, c.groupsKnown); got != c.want {
			t.Errorf("%+v (groups known %v): %v, want %v", c.id, c.groupsKnown, got, c.want)
		}
	}
	users := AllowList{Users: []string{"bob"}}
	if users.AllowsRecorded(Identity{Subject: "carol"}, false) {
		t.Error("without a group list, an unlisted subject with unknown groups is allowed")
	}
	if !(AllowList{}).AllowsRecorded(Identity{Subject: "anyone"}, true) {
		t.Error("an empty allow-list refuses")
	}
}
