package binding

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/validation"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// FuzzNamespaceName: the provider namespace of any identity (as an
// identity provider and a client send it) under any accepted prefix is a
// valid namespace name that starts with the prefix, is stable, never
// shows the subject, and differs from the namespace of any other
// identity; its hash is a valid label value. An identity that
// validateIdentity accepts fits into the namespace's annotations.
func FuzzNamespaceName(f *testing.F) {
	f.Add("kube-bind-", "https://idp.example.com", "alice", "abc123", "https://idp.example.com", "Alice", "abc123")
	f.Add("kube-bind-", "a/b", "c", "x", "a", "b/c", "x")
	f.Add("kube-bind-", "a", "b", "\x00c", "a", "b\x00", "c")
	f.Add("t-", "https://idp", "ünïcödé ../../ ; DROP TABLE", "x", "https://idp", "\xff\xfe", "")
	f.Add(strings.Repeat("a", maxPrefixLength), "i", "s", "c", "i", "s", "c ")
	f.Add("Kube_", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, prefix, iss, sub, cid, iss2, sub2, cid2 string) {
		if err := ValidatePrefix(prefix); err != nil {
			// Refused only for names that would be invalid, or against
			// the documented rule that a prefix starts with a letter
			// (namespaces may start with a digit; ours do not).
			startsWithLetter := prefix != "" && prefix[0] >= 'a' && prefix[0] <= 'z'
			if len(validation.NameIsDNSLabel(prefix+strings.Repeat("a", nameHashLength), false)) == 0 && len(prefix) <= maxPrefixLength && startsWithLetter {
				t.Fatalf("prefix %q refused (%v), yet it makes valid names", prefix, err)
			}
			return
		}
		c := Consumer{Issuer: iss, Subject: sub}
		name := namespaceName(prefix, c, cid)
		if errs := validation.ValidateNamespaceName(name, false); len(errs) > 0 {
			t.Fatalf("namespace %q of %+v %q: %v", name, c, cid, errs)
		}
		if !strings.HasPrefix(name, prefix) || len(name) != len(prefix)+nameHashLength {
			t.Fatalf("namespace %q: want prefix %q and %d hash characters", name, prefix, nameHashLength)
		}
		if namespaceName(prefix, c, cid) != name {
			t.Fatal("not stable")
		}
		if errs := utilvalidation.IsValidLabelValue(identityHash(c, cid)); len(errs) > 0 {
			t.Fatalf("label value: %v", errs)
		}
		if len(sub) >= 8 && strings.Contains(name[len(prefix):], strings.ToLower(sub)) {
			t.Fatalf("namespace %q shows the subject %q", name, sub)
		}
		c2 := Consumer{Issuer: iss2, Subject: sub2}
		if (c2 != c || cid2 != cid) && namespaceName(prefix, c2, cid2) == name {
			t.Fatalf("%+v %q and %+v %q share namespace %s", c, cid, c2, cid2, name)
		}
		if err := validateIdentity(c, cid); err != nil {
			if !errors.Is(err, ErrInvalidIdentity) {
				t.Fatalf("validateIdentity: %v", err)
			}
			return
		}
		annotations := map[string]string{AnnotationIssuer: iss, AnnotationSubject: sub, AnnotationCluster: cid}
		if errs := validation.ValidateAnnotations(annotations, field.NewPath("metadata", "annotations")); len(errs) > 0 {
			t.Fatalf("annotations of an accepted identity: %v", errs)
		}
	})
}

// FuzzParseBoundBy: a bound-by annotation (written by the backend, but
// editable by whoever may patch ClusterBindings) never panics the
// controller; what it accepts has an identity Provision accepts and
// recordable groups, and encodes to a record that parses to the same.
func FuzzParseBoundBy(f *testing.F) {
	f.Add(BoundBy{Issuer: "https://idp.example.com", Subject: "alice", Email: "a@example.com", Groups: []string{"team-a"}, GroupsKnown: true}.Encode())
	f.Add(BoundBy{Issuer: "https://idp", Subject: "sub"}.Encode())
	f.Add(`{"iss":"i","sub":"s","groups":["g"]}`)
	f.Add(`{"iss":"i","sub":"s","extra":1}`)
	f.Add(`{"iss":"i","sub":"s"} {}`)
	f.Add(`{"iss":"","sub":"s"}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, raw string) {
		b, err := ParseBoundBy(raw)
		if err != nil {
			if !errors.Is(err, ErrBadBoundBy) {
				t.Fatalf("error %v is not ErrBadBoundBy", err)
			}
			return
		}
		if validateIdentity(Consumer{Issuer: b.Issuer, Subject: b.Subject}, "x") != nil {
			t.Fatalf("accepted an identity Provision refuses: %+v", b)
		}
		if _, ok := RecordableGroups(b.Groups); !ok || !b.GroupsKnown && len(b.Groups) > 0 {
			t.Fatalf("accepted groups Provision never records: %+v", b)
		}
		again, err := ParseBoundBy(b.Encode())
		if err != nil {
			t.Fatalf("own encoding of %+v refused: %v", b, err)
		}
		if again.Encode() != b.Encode() {
			t.Fatalf("round trip: %+v, want %+v", again, b)
		}
	})
}

// Every record Provision writes parses back.
func TestBoundByOfProvision(t *testing.T) {
	many := make([]string, MaxBoundGroups+1)
	for i := range many {
		many[i] = "g"
	}
	for _, c := range []Consumer{
		{Issuer: "https://idp", Subject: strings.Repeat("s", maxSubjectLength)},
		{Issuer: "https://idp", Subject: "s", Claims: &Claims{Email: "a@b", Groups: []string{"x", strings.Repeat("y", maxBoundGroupsBytes-1)}, GroupsKnown: true}},
		{Issuer: "https://idp", Subject: "s", Claims: &Claims{Groups: many, GroupsKnown: true}},
		{Issuer: strings.Repeat("\x01", maxIssuerLength), Subject: strings.Repeat("\"", maxSubjectLength), Claims: &Claims{Email: strings.Repeat("<", maxBoundEmailBytes)}},
		{Issuer: "i", Subject: "s", Claims: &Claims{Email: strings.Repeat("e", maxBoundEmailBytes+1)}},
		{Issuer: "i", Subject: "s", Claims: &Claims{Email: "\xff"}},
	} {
		b := boundBy(c)
		got, err := ParseBoundBy(b.Encode())
		if err != nil {
			t.Fatalf("record of %+v: %v", c, err)
		}
		if got.Subject != c.Subject || (c.Claims != nil && len(c.Claims.Groups) > MaxBoundGroups && got.GroupsKnown) {
			t.Errorf("record of %+v parsed to %+v", c, got)
		}
	}
}
