package binding

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
)

// QuotaName is the ResourceQuota Provision makes in each consumer
// namespace.
const QuotaName = "kube-bind-consumer"

// Quota is how many objects of each kind a consumer may create in its
// provider namespace. The API server refuses one more at admission, with
// a message naming the quota, so that no consumer can fill etcd, the
// backend's caches or the cluster's namespaces.
type Quota struct {
	// ExportRequests caps APIServiceExportRequests
	// (--consumer-max-export-requests).
	ExportRequests int
	// Namespaces caps APIServiceNamespaces, and so the provider
	// namespaces made for one consumer (--consumer-max-namespaces).
	Namespaces int
}

// Default per-consumer limits: far above what one consumer cluster binds
// (an export request per API, an APIServiceNamespace per consumer
// namespace that holds bound objects), far below what hurts a provider.
const (
	DefaultMaxExportRequests = 64
	DefaultMaxNamespaces     = 64
	// maxQuota keeps a mistyped flag from meaning "no limit".
	maxQuota = 10000
)

// DefaultQuota is the quota with the default limits.
func DefaultQuota() Quota {
	return Quota{ExportRequests: DefaultMaxExportRequests, Namespaces: DefaultMaxNamespaces}
}

// Validate checks each limit is between 1 and 10000.
func (q Quota) Validate() error {
	for _, l := range []struct {
		flag string
		n    int
	}{{"consumer-max-export-requests", q.ExportRequests}, {"consumer-max-namespaces", q.Namespaces}} {
		if l.n < 1 || l.n > maxQuota {
			return fmt.Errorf("--%s %d: must be between 1 and %d", l.flag, l.n, maxQuota)
		}
	}
	return nil
}

// hard is the quota's spec.hard: object counts of the kinds a consumer
// creates (its role, ConsumerClusterRole, creates nothing else).
func (q Quota) hard() corev1.ResourceList {
	count := func(n int) resource.Quantity { return resource.MustParse(strconv.Itoa(n)) }
	return corev1.ResourceList{
		"count/apiserviceexportrequests." + kubeBindGroup: count(q.ExportRequests),
		"count/apiservicenamespaces." + kubeBindGroup:     count(q.Namespaces),
	}
}

// quotaCountedWait bounds how long Provision waits for a new quota to be
// counted. kube-controller-manager counts a new quota within
// milliseconds, but only for the kinds it discovered, which it does every
// 30 s: right after the CRDs were installed, longer.
const quotaCountedWait = 10 * time.Second

// applyQuota makes or updates the consumer namespace's ResourceQuota, and
// waits until kube-controller-manager has counted it: until then the API
// server admits none of the counted kinds ("status unknown for quota"),
// and the consumer's first export request, made right after the bind,
// would be refused. Past quotaCountedWait it goes on: clients retry.
// Lowering a limit refuses new objects beyond it; existing ones stay.
func (p *Provisioner) applyQuota(ctx context.Context, ns string) error {
	hard := p.cfg.Quota.hard()
	ac := corev1ac.ResourceQuota(QuotaName, ns).
		WithLabels(map[string]string{LabelManagedBy: managedByValue}).
		WithSpec(corev1ac.ResourceQuotaSpec().WithHard(hard))
	q, err := p.client.CoreV1().ResourceQuotas(ns).Apply(ctx, ac, applyOptions)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(quotaCountedWait)
	for !quotaCounted(q, hard) && time.Now().Before(deadline) {
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
		if q, err = p.client.CoreV1().ResourceQuotas(ns).Get(ctx, QuotaName, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// quotaCounted says whether q's status counts every kind of hard with
// its current limit.
func quotaCounted(q *corev1.ResourceQuota, hard corev1.ResourceList) bool {
	for name, limit := range hard {
		have, ok := q.Status.Hard[name]
		if _, used := q.Status.Used[name]; !ok || !used || have.Cmp(limit) != 0 {
			return false
		}
	}
	return true
}
