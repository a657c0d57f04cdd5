package binding

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
)

// The consumer's credential (docs/binding.md, "Credential lifecycle"): a
// TokenRequest token of the consumer's service account, with a bounded
// lifetime, bound to a Secret of its own, so that deleting that Secret
// revokes exactly that token. Every bind and every rotation issues a new
// one; the kubeconfig Secret names the current one. Older tokens are
// "retired" and stay valid until the konnector has switched (or they
// expire); internal/binding/controllers/credentials revokes them.
const (
	// LabelCredential marks the per-token Secrets; its value is
	// CredentialToken.
	LabelCredential = "kube-bind.io/credential"
	CredentialToken = "token"
	// TokenSecretPrefix starts every per-token Secret's name.
	TokenSecretPrefix = "kube-bind-consumer-token-"

	// AnnotationTokenSecret, on the kubeconfig Secret: the per-token
	// Secret of the token in it.
	AnnotationTokenSecret = "kube-bind.io/token-secret"
	// AnnotationIssuedAt and AnnotationExpiresAt (RFC 3339): on the
	// kubeconfig Secret for its token; on a token Secret for that token
	// (expires-at from its retirement on).
	AnnotationIssuedAt  = "kube-bind.io/issued-at"
	AnnotationExpiresAt = "kube-bind.io/expires-at"
	// AnnotationIssuedBy, on a token Secret: IssuedByBind (the token went
	// to the client that bound) or IssuedByRotation (it reaches the
	// konnector only through the provider-side kubeconfig Secret).
	AnnotationIssuedBy = "kube-bind.io/issued-by"
	IssuedByBind       = "bind"
	IssuedByRotation   = "rotation"
	// AnnotationRetiredAt, on a token Secret or the legacy token Secret:
	// when another token replaced it in the kubeconfig Secret.
	AnnotationRetiredAt = "kube-bind.io/retired-at"

	// TokenSecretName is the legacy non-expiring token Secret that
	// bindings made before TokenRequest tokens carry; it is retired on
	// their next rotation or bind and then deleted.
	TokenSecretName = "kube-bind-consumer-token"

	// DefaultTokenLifetime is the lifetime of issued tokens when
	// Config.TokenLifetime is 0; MinTokenLifetime is the API server's
	// minimum for expirationSeconds.
	DefaultTokenLifetime = 24 * time.Hour
	MinTokenLifetime     = 10 * time.Minute
)

// IssuedToken describes a token written into the kubeconfig Secret (by a
// bind or RotateToken).
type IssuedToken struct {
	Kubeconfig []byte
	// Secret is the per-token Secret the token is bound to.
	Secret              string
	IssuedAt, ExpiresAt time.Time
}

// RotateToken issues a new token (IssuedByRotation) for the consumer
// service account of provider namespace ns (which Provision made), writes
// a kubeconfig with it into the kubeconfig Secret, and marks the token it
// replaces as retired. kubeconfig is the kubeconfig Secret as the caller
// has just read it (nil: there is none): the token it names is the one
// retired, and RotateToken does not read it again. The replaced token
// stays valid: revoking it once the konnector has switched is the job of
// internal/binding/controllers/credentials.
func (p *Provisioner) RotateToken(ctx context.Context, ns string, kubeconfig *corev1.Secret) (IssuedToken, error) {
	return p.writeToken(ctx, ns, IssuedByRotation, kubeconfig)
}

// issueToken is the token of a bind; without replacing, ns was made by
// this bind and holds no kubeconfig Secret to read and no token to retire.
func (p *Provisioner) issueToken(ctx context.Context, ns, issuedBy string, replacing bool) (IssuedToken, error) {
	var previous *corev1.Secret
	if replacing {
		var err error
		previous, err = p.client.CoreV1().Secrets(ns).Get(ctx, KubeconfigSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			previous, err = nil, nil
		}
		if err != nil {
			return IssuedToken{}, fmt.Errorf("reading the kubeconfig Secret: %w", err)
		}
	}
	return p.writeToken(ctx, ns, issuedBy, previous)
}

// writeToken issues a token marked issuedBy, writes its kubeconfig over
// previous (the kubeconfig Secret as read, or nil) and retires the token
// previous named.
func (p *Provisioner) writeToken(ctx context.Context, ns, issuedBy string, previous *corev1.Secret) (IssuedToken, error) {
	secrets := p.client.CoreV1().Secrets(ns)
	now := p.now().UTC()
	bound, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: TokenSecretPrefix,
			Labels:       map[string]string{LabelManagedBy: managedByValue, LabelCredential: CredentialToken},
			Annotations: map[string]string{
				AnnotationIssuedBy: issuedBy,
				AnnotationIssuedAt: now.Format(time.RFC3339),
			},
		},
		Type: corev1.SecretTypeOpaque,
	}, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return IssuedToken{}, fmt.Errorf("creating the token's Secret: %w", err)
	}
	seconds := int64(p.cfg.TokenLifetime / time.Second)
	tr, err := p.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, ServiceAccountName, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{
			ExpirationSeconds: &seconds,
			BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: bound.Name, UID: bound.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		// The Secret without a token is harmless; internal/binding/controllers/credentials
		// removes it like any retired one.
		return IssuedToken{}, fmt.Errorf("requesting a token: %w", err)
	}
	issued := IssuedToken{Secret: bound.Name, IssuedAt: now, ExpiresAt: tr.Status.ExpirationTimestamp.UTC()}
	issued.Kubeconfig, err = p.endpoint.kubeconfig(ns, tr.Status.Token)
	if err != nil {
		return IssuedToken{}, err
	}
	ac := corev1ac.Secret(KubeconfigSecretName, ns).
		WithLabels(map[string]string{LabelManagedBy: managedByValue}).
		WithAnnotations(map[string]string{
			AnnotationTokenSecret: issued.Secret,
			AnnotationIssuedAt:    issued.IssuedAt.Format(time.RFC3339),
			AnnotationExpiresAt:   issued.ExpiresAt.Format(time.RFC3339),
		}).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{KubeconfigSecretKey: issued.Kubeconfig})
	if _, err := secrets.Apply(ctx, ac, applyOptions); err != nil {
		return IssuedToken{}, fmt.Errorf("writing the kubeconfig Secret: %w", err)
	}
	if err := p.retire(ctx, ns, previous, now); err != nil {
		return IssuedToken{}, err
	}
	return issued, nil
}

// retire marks the token of the kubeconfig Secret previous (before it was
// replaced) as retired at now: its per-token Secret, or the legacy token
// Secret for a binding made before TokenRequest tokens.
func (p *Provisioner) retire(ctx context.Context, ns string, previous *corev1.Secret, now time.Time) error {
	if previous == nil {
		return nil
	}
	name := previous.Annotations[AnnotationTokenSecret]
	ann := map[string]string{AnnotationRetiredAt: now.Format(time.RFC3339)}
	if name == "" {
		name = TokenSecretName
	} else if exp := previous.Annotations[AnnotationExpiresAt]; exp != "" {
		ann[AnnotationExpiresAt] = exp
	}
	err := MarkRetired(ctx, p.client.CoreV1().Secrets(ns), name, ann)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("marking token Secret %s retired: %w", name, err)
	}
	return nil
}

// secretPatcher is the one method of a Secrets client MarkRetired uses.
type secretPatcher interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Secret, error)
}

// MarkRetired sets annotations on a token Secret with a merge patch.
func MarkRetired(ctx context.Context, secrets secretPatcher, name string, annotations map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = secrets.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

// Existing reports whether the identity is bound (its namespace exists)
// and when its namespace was created. A namespace of that name that
// belongs to another identity is ErrIdentityConflict.
func (p *Provisioner) Existing(ctx context.Context, c Consumer, clusterID string) (time.Time, bool, error) {
	if err := validateIdentity(c, clusterID); err != nil {
		return time.Time{}, false, err
	}
	ns, err := p.client.CoreV1().Namespaces().Get(ctx, p.Namespace(c, clusterID), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, err
	case !sameIdentity(ns, c, clusterID):
		return time.Time{}, false, fmt.Errorf("%w: namespace %s", ErrIdentityConflict, ns.Name)
	}
	return ns.CreationTimestamp.Time, true, nil
}

func (p *Provisioner) now() time.Time { return p.cfg.Now() }

// TokenLifetime is the lifetime the provisioner asks for.
func (p *Provisioner) TokenLifetime() time.Duration { return p.cfg.TokenLifetime }
