package offers

import (
	"context"
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// Ready condition of a template: whether it is offered, and if not, why.
const (
	ConditionReady = "Ready"
	ReasonOffered  = "Offered"
	statusManager  = "kube-bind-backend"
	statusResync   = 10 * time.Minute
)

// RunStatus writes each template's Ready condition from its verdict until
// ctx ends, so that a provider sees why a template is not offered. It
// runs as a controller, on the leader only (two writers would only agree,
// but need not both write). The Source must be started.
func (s *Source) RunStatus(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	stopOffers, err := s.OnChange(poke)
	if err != nil {
		return err
	}
	defer stopOffers()
	stopCatalog, err := s.catalog.OnChange(func(string) { poke() })
	if err != nil {
		return err
	}
	defer stopCatalog()
	if !cache.WaitForCacheSync(ctx.Done(), s.HasSynced) {
		return nil
	}
	resync := time.NewTicker(statusResync)
	defer resync.Stop()
	for {
		s.writeStatus(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-resync.C:
		}
	}
}

// writeStatus patches the Ready condition of every template whose cached
// condition differs from its verdict. A failed write is logged and left
// for the next change or resync.
func (s *Source) writeStatus(ctx context.Context) {
	for _, t := range s.cachedTemplates() {
		v := judge(s.catalog, t, s.cfg)
		want := v1alpha2.Condition{Type: ConditionReady, Status: string(metav1.ConditionTrue), Reason: ReasonOffered,
			Message: "offered to consumers"}
		if !v.Offered() {
			want.Status, want.Reason, want.Message = string(metav1.ConditionFalse), v.Reason, v.Message
		}
		conditions, changed := setCondition(t.Status.Conditions, want, time.Now())
		if !changed {
			continue
		}
		patch, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": t.Metadata.ResourceVersion},
			"status":   map[string]any{"conditions": conditions},
		})
		_, err := s.dynamic.Resource(kbresources.APIServiceExportTemplates).Patch(ctx, t.Metadata.Name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: statusManager}, "status")
		if err != nil {
			s.cfg.Logger.Warn("offers: writing a template's Ready condition failed; trying again on the next change",
				"template", t.Metadata.Name, "error", err)
			continue
		}
		s.cfg.Logger.Info("offers: template status", "template", t.Metadata.Name, "ready", want.Status, "reason", want.Reason)
	}
}

// setCondition puts want into conditions, keeping the transition time
// when the status did not change; it says whether anything changed.
func setCondition(conditions []v1alpha2.Condition, want v1alpha2.Condition, now time.Time) ([]v1alpha2.Condition, bool) {
	out := make([]v1alpha2.Condition, 0, len(conditions)+1)
	found := false
	for _, c := range conditions {
		if c.Type != want.Type {
			out = append(out, c)
			continue
		}
		found = true
		if c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message {
			return conditions, false
		}
		want.LastTransitionTime = c.LastTransitionTime
		if c.Status != want.Status {
			want.LastTransitionTime = metav1.NewTime(now)
		}
		out = append(out, want)
	}
	if !found {
		want.LastTransitionTime = metav1.NewTime(now)
		out = append(out, want)
	}
	return out, true
}
