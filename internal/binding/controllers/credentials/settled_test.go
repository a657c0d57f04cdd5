package credentials

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kbprovider/backend/internal/binding"
)

// settledBinding is a ClusterBinding that shows the condition cond and
// the record of a look that decided d.
func settledBinding(cond Condition, d Decision) *unstructured.Unstructured {
	cb := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "cluster", "namespace": "kbc-x", "annotations": map[string]any{
			binding.AnnotationBoundAt: "2026-12-01T10:00:00Z",
		}},
		"status": map[string]any{"conditions": []any{
			map[string]any{"type": "Healthy", "status": "True"},
			map[string]any{"type": ConditionType, "status": cond.Status, "reason": cond.Reason, "message": cond.Message},
		}},
	}}
	a := cb.GetAnnotations()
	a[AnnotationSettled] = settledRecord(cb, d)
	cb.SetAnnotations(a)
	return cb
}

func TestSettledRecord(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	valid := Condition{Status: "True", Reason: ReasonValid, Message: "the konnector holds a valid token"}
	due := now.Add(3 * time.Hour)
	for _, c := range []struct {
		name     string
		change   func(cb *unstructured.Unstructured)
		now      time.Time
		wantOK   bool
		wantWait time.Duration
	}{
		{"unchanged, due in 3h: the hourly look", nil, now, true, maxRequeue},
		{"unchanged, due in 10m", nil, due.Add(-10 * time.Minute), true, 10 * time.Minute},
		{"due now", nil, due, false, 0},
		{"a rotation asked for since", func(cb *unstructured.Unstructured) {
			a := cb.GetAnnotations()
			a[AnnotationRotate] = now.Format(time.RFC3339)
			cb.SetAnnotations(a)
		}, now, false, 0},
		{"bound again since", func(cb *unstructured.Unstructured) {
			a := cb.GetAnnotations()
			a[binding.AnnotationBoundAt] = now.Format(time.RFC3339)
			cb.SetAnnotations(a)
		}, now, false, 0},
		{"the condition was rewritten (the consumer may write the status)", func(cb *unstructured.Unstructured) {
			conds, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
			conds[1].(map[string]any)["message"] = "all good, trust me"
			_ = unstructured.SetNestedSlice(cb.Object, conds, "status", "conditions")
		}, now, false, 0},
		{"no condition", func(cb *unstructured.Unstructured) {
			unstructured.RemoveNestedField(cb.Object, "status")
		}, now, false, 0},
		{"an unreadable record", func(cb *unstructured.Unstructured) {
			a := cb.GetAnnotations()
			a[AnnotationSettled] = "soon " + a[AnnotationSettled]
			cb.SetAnnotations(a)
		}, now, false, 0},
		{"no record", func(cb *unstructured.Unstructured) {
			a := cb.GetAnnotations()
			delete(a, AnnotationSettled)
			cb.SetAnnotations(a)
		}, now, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cb := settledBinding(valid, Decision{Condition: &valid, Due: due})
			if c.change != nil {
				c.change(cb)
			}
			wait, ok := settledWait(cb, c.now)
			if ok != c.wantOK || wait != c.wantWait {
				t.Errorf("settledWait: %s, %v; want %s, %v", wait, ok, c.wantWait, c.wantOK)
			}
		})
	}

	// Nothing due: looked at hourly.
	cb := settledBinding(valid, Decision{Condition: &valid})
	if wait, ok := settledWait(cb, now.Add(1000*time.Hour)); !ok || wait != maxRequeue {
		t.Errorf("nothing due: %s, %v; want %s, true", wait, ok, maxRequeue)
	}
}
