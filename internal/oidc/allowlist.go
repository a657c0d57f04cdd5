package oidc

import "slices"

// AllowList is who may bind (--oidc-allowed-users, --oidc-allowed-groups):
// everybody when both lists are empty; otherwise a user listed by subject,
// or by e-mail address when the address is verified, or a member of a
// listed group. The login applies it, and internal/binding/controllers/credentials applies it
// again to the recorded identity of every binding, so that removing a
// user ends the bindings they made.
type AllowList struct {
	Users  []string
	Groups []string
}

// AllowList is the configuration's allow-list.
func (c Config) AllowList() AllowList {
	return AllowList{Users: c.AllowedUsers, Groups: c.AllowedGroups}
}

// Open: everybody is allowed.
func (l AllowList) Open() bool { return len(l.Users) == 0 && len(l.Groups) == 0 }

// Allows says whether the list admits id.
func (l AllowList) Allows(id Identity) bool {
	if l.Open() || slices.Contains(l.Users, id.Subject) {
		return true
	}
	if id.Email != "" && id.EmailVerified && slices.Contains(l.Users, id.Email) {
		return true
	}
	for _, g := range id.Groups {
		if slices.Contains(l.Groups, g) {
			return true
		}
	}
	return false
}

// AllowsRecorded judges an identity recorded at a bind whose groups may
// not be known (the bind came with a CLI token, which carries the subject
// only, or was made before groups were recorded): with a group list set,
// such an identity is kept, because it may have been admitted by a group;
// the binding's absolute lifetime still ends it.
func (l AllowList) AllowsRecorded(id Identity, groupsKnown bool) bool {
	if !groupsKnown && len(l.Groups) > 0 {
		return true
	}
	return l.Allows(id)
}
