package apply

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Identity is what a provider issued to identify this cluster: the cluster
// ID presented on every later bind (so each lands in the same provider
// namespace) and, from backends that issue one, the secret that proves the
// ID is ours.
type Identity struct {
	ClusterID     string
	ClusterSecret string
}

// The identity Secret: one per provider in kube-bind, named after a hash of
// the provider's host (so any machine that binds into this cluster finds
// it), labelled so it is easy to find, and never read by the konnector.
const (
	identityPrefix         = "cluster-identity-"
	LabelIdentity          = "kube-bind.io/cluster-identity"
	AnnotationProviderHost = "kube-bind.io/provider-host"
	keyClusterID           = "clusterID"
	keyClusterSecret       = "clusterSecret"
)

// ProviderKey is the key under which a provider's identity is kept: the
// export URL's host[:port], lower case. A provider is one host: the
// backend issues cluster IDs for all its export URLs alike.
func ProviderKey(exportURL string) (string, error) {
	u, err := url.Parse(exportURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("export URL %q has no host", exportURL)
	}
	return strings.ToLower(u.Host), nil
}

// IdentitySecretName is the name of the identity Secret for a provider key.
func IdentitySecretName(providerKey string) string {
	sum := sha256.Sum256([]byte(providerKey))
	return identityPrefix + hex.EncodeToString(sum[:])[:16]
}

// LoadIdentity returns the identity kept for the provider of exportURL, or
// a zero Identity when there is none.
func (b *Binder) LoadIdentity(ctx context.Context, exportURL string) (Identity, error) {
	key, err := ProviderKey(exportURL)
	if err != nil {
		return Identity{}, err
	}
	s, err := b.kube.CoreV1().Secrets(Namespace).Get(ctx, IdentitySecretName(key), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Identity{}, nil
	}
	if err != nil {
		return Identity{}, fmt.Errorf("reading the cluster identity for %s in namespace %s: %w", key, Namespace, err)
	}
	if got := s.Annotations[AnnotationProviderHost]; got != key {
		return Identity{}, fmt.Errorf("Secret %s/%s is for provider %q, not %q; delete it to start over", Namespace, s.Name, got, key) //nolint:staticcheck // ST1005: Secret is the Kubernetes kind
	}
	return Identity{ClusterID: string(s.Data[keyClusterID]), ClusterSecret: string(s.Data[keyClusterSecret])}, nil
}

func identitySecret(providerKey string, id Identity) *corev1.Secret {
	labels := managedLabels()
	labels[LabelIdentity] = "true"
	data := map[string][]byte{keyClusterID: []byte(id.ClusterID)}
	if id.ClusterSecret != "" {
		data[keyClusterSecret] = []byte(id.ClusterSecret)
	}
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: IdentitySecretName(providerKey), Namespace: Namespace,
			Labels: labels, Annotations: map[string]string{AnnotationProviderHost: providerKey},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// saveIdentity keeps id for the provider, replacing what was kept. A
// cluster secret once kept is not dropped when the provider answers
// without one for the same ID (it issues secrets with new IDs only).
func (b *Binder) saveIdentity(ctx context.Context, providerKey string, id Identity) (string, error) {
	want := identitySecret(providerKey, id)
	secrets := b.kube.CoreV1().Secrets(Namespace)
	cur, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, err := secrets.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return "", err
		}
		return "kept cluster ID " + id.ClusterID + " in Secret " + Namespace + "/" + want.Name, nil
	}
	if err != nil {
		return "", err
	}
	if string(cur.Data[keyClusterID]) == id.ClusterID && id.ClusterSecret == "" && len(cur.Data[keyClusterSecret]) > 0 {
		want.Data[keyClusterSecret] = cur.Data[keyClusterSecret]
	}
	if string(cur.Data[keyClusterID]) == id.ClusterID && string(cur.Data[keyClusterSecret]) == string(want.Data[keyClusterSecret]) {
		return "cluster ID " + id.ClusterID + " already kept", nil
	}
	cur.Data = want.Data
	cur.Labels, cur.Annotations = want.Labels, want.Annotations
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return "", err
	}
	return "updated the cluster identity in Secret " + Namespace + "/" + want.Name, nil
}
