package credentials

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// AnnotationSettled on a ClusterBinding records the last look that found
// nothing to do: until when nothing is due, and a digest of what it
// decided on that the cache shows (the annotations this controller reads
// and the condition it reported). A new leader trusts a record that
// still matches instead of listing the namespace's Secrets, so a settled
// provider costs no request per consumer on a handover. Only the backend
// and the provider's admins write a ClusterBinding's metadata; a
// consumer, who writes its status, can only make a record not match,
// which costs a look.
const AnnotationSettled = "kube-bind.io/credentials-settled"

// settledNever is the record's time when nothing is due.
const settledNever = "never"

// settledRecord is the value of AnnotationSettled for a look at cb that
// decided d.
func settledRecord(cb *unstructured.Unstructured, d Decision) string {
	until := settledNever
	if !d.Due.IsZero() {
		until = d.Due.UTC().Format(time.RFC3339)
	}
	return until + " " + settledDigest(cb, d.Condition)
}

// settledDigest digests the inputs of a decision that the cache shows:
// the annotations Observe reads and the condition.
func settledDigest(cb *unstructured.Unstructured, cond *Condition) string {
	a := cb.GetAnnotations()
	h := sha256.New()
	for _, v := range []string{a[AnnotationRotate], a[binding.AnnotationBoundAt], a[binding.AnnotationBoundBy],
		cond.Status, cond.Reason, cond.Message} {
		// Length-prefixed, so that no two lists digest alike.
		fmt.Fprintf(h, "%d:%s", len(v), v)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// reportedCondition is this controller's condition on cb, as the cache
// shows it; nil when there is none.
func reportedCondition(cb *unstructured.Unstructured) *Condition {
	conditions, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	for _, raw := range conditions {
		m, _ := raw.(map[string]any)
		if m["type"] != ConditionType {
			continue
		}
		status, _ := m["status"].(string)
		reason, _ := m["reason"].(string)
		message, _ := m["message"].(string)
		return &Condition{Status: status, Reason: reason, Message: message}
	}
	return nil
}

// settledWait says whether cb's record still holds at now, and if so
// when to look at it next. The caller has checked the allow-list.
func settledWait(cb *unstructured.Unstructured, now time.Time) (time.Duration, bool) {
	until, digest, ok := strings.Cut(cb.GetAnnotations()[AnnotationSettled], " ")
	cond := reportedCondition(cb)
	if !ok || cond == nil || digest != settledDigest(cb, cond) {
		return 0, false
	}
	if until == settledNever {
		return maxRequeue, true
	}
	due, err := time.Parse(time.RFC3339, until)
	if err != nil || !now.Before(due) {
		return 0, false
	}
	return min(due.Sub(now), maxRequeue), true
}

// recordSettled writes cb's record of a look that decided d, when it
// differs from the one there.
func (r *run) recordSettled(ctx context.Context, cb *unstructured.Unstructured, d Decision) error {
	record := settledRecord(cb, d)
	if cb.GetAnnotations()[AnnotationSettled] == record {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationSettled: record}}})
	if err != nil {
		return err
	}
	_, err = r.dyn.Resource(kbresources.ClusterBindings).Namespace(cb.GetNamespace()).Patch(ctx, cb.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("recording the settled credentials of %s: %w", cb.GetNamespace(), err)
	}
	return nil
}
