package binding

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The bound on provider namespaces per user (docs/binding.md, "A bound
// per user").
const (
	// LabelConsumerUser on a consumer namespace is a hash of the user
	// (issuer and subject) who bound it, so that a user's namespaces are
	// counted with one label selector.
	LabelConsumerUser = "kube-bind.io/consumer-user"
	// AnnotationClusterIssued, "true", marks a namespace made by the
	// poll flow (ProofIssued): a CLI token alone (ProofToken) never
	// reaches it.
	AnnotationClusterIssued = "kube-bind.io/cluster-id-issued"

	// DefaultMaxClustersPerUser is --max-clusters-per-user's default.
	DefaultMaxClustersPerUser = 10
	// MaxMaxClustersPerUser bounds the flag.
	MaxMaxClustersPerUser = 10000
	// rollbackTimeout bounds the deletion of a namespace made beyond the
	// cap, even when the bind's request is gone.
	rollbackTimeout = 10 * time.Second
)

// ValidateMaxClustersPerUser checks --max-clusters-per-user.
func ValidateMaxClustersPerUser(n int) error {
	if n < 1 || n > MaxMaxClustersPerUser {
		return fmt.Errorf("the clusters per user must be 1 to %d, not %d", MaxMaxClustersPerUser, n)
	}
	return nil
}

// ErrClusterCap matches any *ClusterCapError with errors.Is.
var ErrClusterCap = errors.New("the user has as many clusters bound as this provider allows")

// ErrClusterNotProven: the namespace of this identity was made by the
// poll flow, with a cluster ID the backend issued; a CLI token alone may
// not reach it.
var ErrClusterNotProven = errors.New("the provider namespace of this cluster ID was made by the poll flow; a CLI token alone does not reach it")

// ClusterCapError refuses a new provider namespace beyond the user's cap.
type ClusterCapError struct {
	// Cap is --max-clusters-per-user; Have is how many the user has.
	Cap, Have int
}

func (e *ClusterCapError) Error() string {
	return fmt.Sprintf("this provider binds at most %d clusters per user (--max-clusters-per-user) and you have %d bound: "+
		"a new cluster is refused; rebinding one of yours still works, or ask the provider to unbind one", e.Cap, e.Have)
}

// Is makes errors.Is(err, ErrClusterCap) true for every ClusterCapError.
func (e *ClusterCapError) Is(target error) bool { return target == ErrClusterCap }

// userHash is a hash of (issuer, subject), length-prefixed like
// identityHash and with a label of its own, so that it never equals an
// identity's hash.
func userHash(c Consumer) string {
	h := sha256.New()
	h.Write([]byte("kube-bind user\n"))
	for _, part := range []string{c.Issuer, c.Subject} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return hashEncoding.EncodeToString(h.Sum(nil)) // 52 characters
}

// UserLabel is the LabelConsumerUser value of c's namespaces (for
// operators: kubectl get ns -l kube-bind.io/consumer-user=<it>).
func UserLabel(c Consumer) string { return userHash(c) }

// userNamespaces are the consumer namespaces of the user of c, read
// from the API server (a quorum read, so that a namespace another replica
// just made is seen), those being deleted included: by default those
// labelled with the user (LabelConsumerUser); with older, those made
// before that label existed, which carry no such label (the backend may
// not label namespaces): they are found by their annotations among the
// backend's unlabelled ones, a set that only shrinks.
func (p *Provisioner) userNamespaces(ctx context.Context, c Consumer, older bool) ([]corev1.Namespace, error) {
	sel := LabelConsumerUser + "=" + userHash(c)
	if older {
		sel = LabelManagedBy + "=" + managedByValue + ",!" + LabelConsumerUser + ",!" + LabelConsumerNamespace
	}
	list, err := p.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("counting the user's provider namespaces: %w", err)
	}
	var have []corev1.Namespace
	for _, ns := range list.Items {
		a := ns.Annotations
		if IsConsumerNamespace(&ns) && a[AnnotationIssuer] == c.Issuer && a[AnnotationSubject] == c.Subject {
			have = append(have, ns)
		}
	}
	return have, nil
}

// live counts the namespaces that are not being deleted: those the cap
// counts.
func live(nss []corev1.Namespace) int {
	n := 0
	for _, ns := range nss {
		if ns.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

// holdCap counts the user's namespaces again once ns is made and deletes
// ns if they are more than the cap: binds of one user that run at once
// (on several replicas) each checked the cap before any of them created.
// Every bind that finds too many rolls its own namespace back, before
// anything is made in it; the last of them to create saw all the others,
// so no more than the cap stay, and no half-made binding does. Namespaces
// made by binds carry the user label, so only those are listed again;
// older is the count of unlabelled ones the check before found, a set
// that only shrinks.
func (p *Provisioner) holdCap(ctx context.Context, c Consumer, ns *corev1.Namespace, older int) error {
	labelled, err := p.userNamespaces(ctx, c, false)
	have := live(labelled) + older
	if err == nil && have <= p.cfg.MaxClustersPerUser {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	derr := p.client.CoreV1().Namespaces().Delete(rctx, ns.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ns.UID}})
	if derr != nil && !apierrors.IsNotFound(derr) {
		return fmt.Errorf("rolling back provider namespace %s made beyond the user's cap: %w", ns.Name, derr)
	}
	if err != nil {
		return err
	}
	p.capRefusals.Add(1)
	return &ClusterCapError{Cap: p.cfg.MaxClustersPerUser, Have: have - 1}
}

// CapRefusals is how many new clusters this provisioner refused for
// their user's cap (kube_bind_backend_cluster_cap_refusals_total).
func (p *Provisioner) CapRefusals() int64 { return p.capRefusals.Load() }
