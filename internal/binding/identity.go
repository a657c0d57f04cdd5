package binding

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Consumer is the identity of a consumer: the OIDC issuer and subject of
// the user who bound.
type Consumer struct {
	Issuer  string
	Subject string
	// Claims of the login that binds, recorded for the allow-list
	// re-check (AnnotationBoundBy); nil: issuer and subject only. They do
	// not take part in the identity.
	Claims *Claims
	// Proof says how the bind vouches for the cluster ID. It does not
	// take part in the identity; a namespace made with ProofIssued is
	// never reached with ProofToken (AnnotationClusterIssued).
	Proof ClusterProof
}

// ClusterProof says how a bind vouches for its cluster ID.
type ClusterProof int

const (
	// ProofLogin: the user signed in at the identity provider for this
	// bind and the result goes to their own machine (the callback
	// flows); the cluster ID is the client's word.
	ProofLogin ClusterProof = iota
	// ProofIssued: this backend issued the cluster ID, and the client
	// proved it with its cluster secret or received it with this very
	// session (the poll flow).
	ProofIssued
	// ProofToken: a CLI token alone, with the cluster identity the
	// client asserts (POST /api/bind): whoever holds the token.
	ProofToken
)

// ID is the identity as the BindingResponse names it, "<issuer>/<subject>".
func (c Consumer) ID() string { return c.Issuer + "/" + c.Subject }

// Metadata keys on a provider namespace. The annotations hold the identity
// verbatim (any characters); the label holds its hash so that a namespace
// can be found by identity with a label selector.
const (
	AnnotationIssuer  = "kube-bind.io/consumer-issuer"
	AnnotationSubject = "kube-bind.io/consumer-subject"
	AnnotationCluster = "kube-bind.io/cluster-id"
	LabelConsumerHash = "kube-bind.io/consumer-hash"
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value on everything the backend
	// makes; the chart's admission policy looks for it on namespaces.
	ManagedByValue = "kube-bind-backend"
	managedByValue = ManagedByValue
	// LabelConsumerNamespace marks a namespace made for an
	// APIServiceNamespace (internal/binding/controllers/exportrequests) with the consumer namespace it
	// belongs to, so that Unbind can remove it with the consumer.
	LabelConsumerNamespace = "kube-bind.io/consumer-namespace"
	maxIssuerLength        = 2048
	maxSubjectLength       = 1024
	maxClusterIDLength     = 256
)

// nameHashLength is how many hash characters the namespace name carries:
// 16 base32 characters are 80 bits, so an accidental collision is out of
// reach; a deliberate one is still caught by comparing the annotations.
const nameHashLength = 16

// maxPrefixLength is the documented limit of --namespace-prefix (the
// chart's schema says the same); it leaves room for the hash in a
// 63-character namespace name.
const maxPrefixLength = 40

var _ [63 - nameHashLength - maxPrefixLength]struct{} // fails to compile if the hash does not fit

var (
	prefixPattern = regexp.MustCompile(`^[a-z][-a-z0-9]*$`)
	// lower-case base32 without padding: only a-z and 2-7, valid in names
	// and label values.
	hashEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
)

// ValidatePrefix checks a --namespace-prefix: it must start a valid
// namespace name and leave room for the hash. It is the one rule: the
// backend's flags, the provisioner and the controllers all use it.
func ValidatePrefix(prefix string) error {
	if len(prefix) > maxPrefixLength || !prefixPattern.MatchString(prefix) {
		return fmt.Errorf("%q: want 1 to %d characters of a-z, 0-9 and '-', starting with a letter", prefix, maxPrefixLength)
	}
	return nil
}

// identityHash is a hash of (issuer, subject, clusterID) that no choice of
// characters can make ambiguous: each part is length-prefixed.
func identityHash(c Consumer, clusterID string) string {
	h := sha256.New()
	for _, part := range []string{c.Issuer, c.Subject, clusterID} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return hashEncoding.EncodeToString(h.Sum(nil)) // 52 characters
}

// namespaceName is the provider namespace of an identity: the prefix plus
// a stable short hash, never the raw subject.
func namespaceName(prefix string, c Consumer, clusterID string) string {
	return prefix + identityHash(c, clusterID)[:nameHashLength]
}

// validateIdentity refuses identities that could not be stored faithfully
// in annotations or that are absurdly large.
func validateIdentity(c Consumer, clusterID string) error {
	var errs []string
	check := func(name, v string, max int) {
		switch {
		case v == "":
			errs = append(errs, name+" is empty")
		case len(v) > max:
			errs = append(errs, fmt.Sprintf("%s is longer than %d bytes", name, max))
		case !utf8.ValidString(v):
			errs = append(errs, name+" is not valid UTF-8")
		}
	}
	check("issuer", c.Issuer, maxIssuerLength)
	check("subject", c.Subject, maxSubjectLength)
	check("cluster ID", clusterID, maxClusterIDLength)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidIdentity, strings.Join(errs, ", "))
	}
	return nil
}

// Errors of Provision and Unbind, for errors.Is.
var (
	// ErrInvalidIdentity: empty, oversized or non-UTF-8 issuer, subject or
	// cluster ID.
	ErrInvalidIdentity = errors.New("invalid consumer identity")
	// ErrNoResources: the selection is empty.
	ErrNoResources = errors.New("no resources selected")
	// ErrIdentityConflict: the namespace derived for this identity belongs
	// to another identity (a hash collision, or a namespace made by hand).
	ErrIdentityConflict = errors.New("provider namespace belongs to another consumer")
	// ErrNamespaceTerminating: the consumer was just unbound and its
	// namespace is still being deleted; binding again works once it is gone.
	ErrNamespaceTerminating = errors.New("provider namespace is being deleted")
	// ErrNotBound: Unbind found no namespace for the identity.
	ErrNotBound = errors.New("consumer is not bound")
)

// NotExportedError refuses a resource that is not in the catalog.
type NotExportedError struct {
	Group, Resource string
}

func (e *NotExportedError) Error() string {
	return fmt.Sprintf("resource %q of group %q is not exported by this provider", e.Resource, e.Group)
}

// Is makes errors.Is(err, ErrNotExported) true for every NotExportedError.
func (e *NotExportedError) Is(target error) bool { return target == ErrNotExported }

// ErrNotExported matches any *NotExportedError with errors.Is.
var ErrNotExported = errors.New("resource not exported")

func sha256Sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}
