package binding

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// What Provision records on ClusterBinding "cluster" about the bind, so
// that internal/binding/controllers/credentials can end the binding's credentials when its
// absolute lifetime is over or the user who bound is no longer allowed
// (docs/binding.md, "Threat model"). Consumers may not patch their
// ClusterBinding, so they cannot move either mark.
const (
	// AnnotationBoundAt (RFC 3339) is when the user last bound through a
	// login: the start of the binding's absolute lifetime. A rebind
	// starts a new one.
	AnnotationBoundAt = "kube-bind.io/bound-at"
	// AnnotationBoundBy is the BoundBy of that bind, as JSON.
	AnnotationBoundBy = "kube-bind.io/bound-by"
)

// Claims are what the identity provider said about the user at a login,
// beyond issuer and subject: what the allow-lists judge.
type Claims struct {
	// Email is the address only when the ID token marked it verified.
	Email string
	// Groups of the ID token; GroupsKnown false when the bind came with
	// the subject alone (a CLI token), or with more groups than are
	// recorded (MaxBoundGroups), so that a group list cannot judge it.
	Groups      []string
	GroupsKnown bool
}

// BoundBy is the identity that bound, as recorded.
type BoundBy struct {
	Issuer      string   `json:"iss"`
	Subject     string   `json:"sub"`
	Email       string   `json:"email,omitempty"`
	Groups      []string `json:"groups,omitempty"`
	GroupsKnown bool     `json:"groupsKnown,omitempty"`
}

// Limits of a recorded BoundBy: they keep the annotation (and the login
// cookie that carries the groups to the bind) small.
const (
	MaxBoundGroups      = 32
	maxBoundGroupsBytes = 1024
	maxBoundEmailBytes  = 512
	// JSON escaping may make each byte 6 (\u00xx).
	maxBoundByBytes = 6*(maxIssuerLength+maxSubjectLength+maxBoundEmailBytes+maxBoundGroupsBytes) + 4*MaxBoundGroups + 128
)

// RecordableGroups returns groups when they can be recorded whole (at most
// MaxBoundGroups, 1 KiB in all, valid UTF-8), else nil and false: a
// partial list would judge the user by groups they may not be admitted
// by. The bound keeps the login cookie that carries them to the bind
// under a browser's 4 KiB.
func RecordableGroups(groups []string) ([]string, bool) {
	if len(groups) > MaxBoundGroups {
		return nil, false
	}
	n := 0
	for _, g := range groups {
		n += len(g)
		if n > maxBoundGroupsBytes || !utf8.ValidString(g) {
			return nil, false
		}
	}
	return groups, true
}

// boundBy is the record of consumer c's bind.
func boundBy(c Consumer) BoundBy {
	b := BoundBy{Issuer: c.Issuer, Subject: c.Subject}
	if c.Claims != nil {
		if e := c.Claims.Email; len(e) <= maxBoundEmailBytes && utf8.ValidString(e) {
			b.Email = e
		}
		if groups, ok := RecordableGroups(c.Claims.Groups); ok && c.Claims.GroupsKnown {
			b.Groups, b.GroupsKnown = groups, true
		}
	}
	return b
}

// Encode is the annotation's value.
func (b BoundBy) Encode() string {
	raw, _ := json.Marshal(b) // strings and bools only: never fails
	return string(raw)
}

// ErrBadBoundBy: an AnnotationBoundBy value that is not a record Provision
// writes.
var ErrBadBoundBy = errors.New("not a bound-by record")

// ParseBoundBy reads an AnnotationBoundBy value. It refuses anything
// Provision would not write: too long, unknown fields, no issuer or
// subject, more or longer groups than recorded.
func ParseBoundBy(s string) (BoundBy, error) {
	if len(s) > maxBoundByBytes {
		return BoundBy{}, fmt.Errorf("%w: %d bytes", ErrBadBoundBy, len(s))
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var b BoundBy
	if err := dec.Decode(&b); err != nil {
		return BoundBy{}, fmt.Errorf("%w: %v", ErrBadBoundBy, err)
	}
	if dec.More() {
		return BoundBy{}, fmt.Errorf("%w: data after the record", ErrBadBoundBy)
	}
	if err := validateIdentity(Consumer{Issuer: b.Issuer, Subject: b.Subject}, "x"); err != nil {
		return BoundBy{}, fmt.Errorf("%w: %v", ErrBadBoundBy, err)
	}
	if _, ok := RecordableGroups(b.Groups); !ok || (!b.GroupsKnown && len(b.Groups) > 0) {
		return BoundBy{}, fmt.Errorf("%w: groups", ErrBadBoundBy)
	}
	if len(b.Email) > maxBoundEmailBytes || !utf8.ValidString(b.Email) {
		return BoundBy{}, fmt.Errorf("%w: e-mail address", ErrBadBoundBy)
	}
	return b, nil
}

// formatTime is how the marks write times.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
