package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// quotaProbe is the namespace and ResourceQuota AwaitQuotaCounting
// leaves behind, so that the next call returns at once.
const quotaProbe = "kube-bind-quota-probe"

// AwaitQuotaCounting returns once kube-controller-manager counts kinds
// (quota resource names such as count/widgets.example.com) in
// ResourceQuotas. Its quota controller discovers new kinds every 30 s;
// until then, the API server admits no counted object in a namespace with
// such a quota. Rather than wait for its next look, it restarts the
// controller manager, which discovers at start.
func (cp *ControlPlane) AwaitQuotaCounting(ctx context.Context, kinds ...corev1.ResourceName) error {
	if cp.quotaCounting(ctx, kinds, 2*time.Second) == nil {
		return nil
	}
	if err := cp.RestartControllerManager(ctx); err != nil {
		return err
	}
	return cp.quotaCounting(ctx, kinds, 45*time.Second)
}

func (cp *ControlPlane) quotaCounting(ctx context.Context, kinds []corev1.ResourceName, timeout time.Duration) error {
	client, err := kubernetes.NewForConfig(cp.admin)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: quotaProbe}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	one := resource.MustParse("1")
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: quotaProbe}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}}}
	for _, k := range kinds {
		q.Spec.Hard[k] = one
	}
	if _, err := client.CoreV1().ResourceQuotas(quotaProbe).Create(ctx, q, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// A quota made before the kinds were discovered is counted again
	// only at the controller's full resync (5 min) or when its limits
	// change: change them at each look.
	limit := int64(1)
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		have, err := client.CoreV1().ResourceQuotas(quotaProbe).Get(ctx, quotaProbe, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		counted := true
		for _, k := range kinds {
			if _, ok := have.Status.Used[k]; !ok {
				counted = false
			}
		}
		if counted {
			return true, nil
		}
		limit = 3 - limit
		for _, k := range kinds {
			have.Spec.Hard[k] = *resource.NewQuantity(limit, resource.DecimalSI)
		}
		_, err = client.CoreV1().ResourceQuotas(quotaProbe).Update(ctx, have, metav1.UpdateOptions{})
		return false, ignoreConflict(err)
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-controller-manager to count %v in resource quotas (is its resourcequota-controller running?): %w", kinds, err)
	}
	return nil
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}
