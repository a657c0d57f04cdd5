package server

import (
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
)

// stillAllowed judges the recorded identity of a binding by the
// allow-list the logins use; nil when everybody may bind.
func stillAllowed(l oidc.AllowList) func(binding.BoundBy) bool {
	if l.Open() {
		return nil
	}
	return func(b binding.BoundBy) bool {
		id := oidc.Identity{Issuer: b.Issuer, Subject: b.Subject, Email: b.Email, EmailVerified: b.Email != "", Groups: b.Groups}
		return l.AllowsRecorded(id, b.GroupsKnown)
	}
}

// cliUserAllowed judges the user a CLI token names by the same
// allow-list; nil when everybody may bind.
func cliUserAllowed(l oidc.AllowList) func(clitoken.User) bool {
	if l.Open() {
		return nil
	}
	return func(u clitoken.User) bool {
		id := oidc.Identity{Subject: u.Subject, Email: u.Email, EmailVerified: u.Email != "", Groups: u.Groups}
		return l.AllowsRecorded(id, u.GroupsKnown)
	}
}
