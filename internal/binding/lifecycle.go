package binding

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// Marks that tell a binding's life after Provision (docs/binding.md,
// "Revocation" and "Garbage collection").
const (
	// LabelRevoked on a consumer namespace, with value "true", is the
	// provider's way to revoke the consumer: the cleanup controller then
	// unbinds it (token first, then the namespace and everything made for
	// it). Provision refuses a revoked namespace meanwhile.
	LabelRevoked = "kube-bind.io/revoked"
	// AnnotationProvisionedAt on ClusterBinding "cluster" is when the last
	// Provision of the namespace completed (RFC 3339): the binding is
	// complete, a response exists.
	AnnotationProvisionedAt = "kube-bind.io/provisioned-at"
	// AnnotationDeliveredAt on ClusterBinding "cluster" is when a
	// BindingResponse for the namespace was first handed out: to a poll,
	// or in the redirect to a CLI's callback.
	AnnotationDeliveredAt = "kube-bind.io/response-delivered-at"
)

// IsRevoked says whether the provider revoked the consumer of ns.
func IsRevoked(labels map[string]string) bool { return labels[LabelRevoked] == "true" }

// ErrNoNamespaceInResponse: a response whose kubeconfig names no provider
// namespace of this backend (it cannot come from Provision).
var ErrNoNamespaceInResponse = errors.New("the response's kubeconfig names no provider namespace of this backend")

// ResponseNamespace returns the provider namespace a BindingResponse (as
// JSON, as stored in a session) was issued for: the namespace of its
// kubeconfig's current context.
func (p *Provisioner) ResponseNamespace(response []byte) (string, error) {
	var resp v1alpha1.BindingResponse
	if err := json.Unmarshal(response, &resp); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoNamespaceInResponse, err)
	}
	cfg, err := clientcmd.Load(resp.Kubeconfig)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoNamespaceInResponse, err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || !strings.HasPrefix(ctx.Namespace, p.cfg.NamespacePrefix) || len(validation.IsDNS1123Label(ctx.Namespace)) > 0 {
		return "", ErrNoNamespaceInResponse
	}
	return ctx.Namespace, nil
}

// MarkDelivered records on the ClusterBinding of the response's namespace
// that the response was handed out (AnnotationDeliveredAt), unless it
// already says so. The garbage collection never removes a delivered
// binding that is complete.
func (p *Provisioner) MarkDelivered(ctx context.Context, response []byte) (string, error) {
	ns, err := p.ResponseNamespace(response)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	cb := p.dynamic.Resource(kbresources.ClusterBindings).Namespace(ns)
	have, err := cb.Get(ctx, ClusterBindingName, metav1.GetOptions{})
	if err != nil {
		return ns, fmt.Errorf("reading ClusterBinding %s/%s: %w", ns, ClusterBindingName, err)
	}
	if have.GetAnnotations()[AnnotationDeliveredAt] != "" {
		return ns, nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]any{AnnotationDeliveredAt: time.Now().UTC().Format(time.RFC3339)},
	}})
	_, err = cb.Patch(ctx, ClusterBindingName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return ns, fmt.Errorf("marking ClusterBinding %s/%s delivered: %w", ns, ClusterBindingName, err)
	}
	return ns, nil
}

// DeliveryMarker calls MarkDelivered in the background, so that handing a
// response out never waits for the provider cluster. Handlers call
// Delivered; Run does the work until its context ends.
type DeliveryMarker struct {
	p     *Provisioner
	log   *slog.Logger
	queue chan []byte
	wg    sync.WaitGroup
}

// deliveryQueue bounds the responses waiting to be marked; a flood beyond
// it is dropped (logged): the binding then merely looks undelivered, and
// the garbage collection still spares it once its konnector heartbeats or
// the consumer creates a request.
const deliveryQueue = 1024

// NewDeliveryMarker returns a marker for p's responses.
func NewDeliveryMarker(p *Provisioner, log *slog.Logger) *DeliveryMarker {
	if log == nil {
		log = slog.Default()
	}
	return &DeliveryMarker{p: p, log: log, queue: make(chan []byte, deliveryQueue)}
}

// Delivered queues a handed-out response (the JSON BindingResponse). It
// never blocks.
func (m *DeliveryMarker) Delivered(response []byte) {
	select {
	case m.queue <- response:
	default:
		m.log.Warn("delivery marker: queue full, a delivered response is not recorded")
	}
}

// Run marks queued responses until ctx ends, then marks what is still
// queued for up to 5 s (responses handed out during the shutdown).
func (m *DeliveryMarker) Run(ctx context.Context) {
	mark := func(ctx context.Context, resp []byte) {
		var ns string
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			if ns, err = m.p.MarkDelivered(ctx, resp); err == nil || errors.Is(err, ErrNoNamespaceInResponse) ||
				apierrors.IsNotFound(err) || ctx.Err() != nil {
				break
			}
			_ = sleep(ctx, time.Duration(attempt+1)*time.Second)
		}
		if err != nil {
			m.log.Warn("delivery marker: could not record a delivered response", "namespace", ns, "error", err)
			return
		}
		m.log.Debug("delivery marker: response recorded as delivered", "namespace", ns)
	}
	for {
		select {
		case resp := <-m.queue:
			mark(ctx, resp)
		case <-ctx.Done():
			drain, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for {
				select {
				case resp := <-m.queue:
					mark(drain, resp)
				default:
					return
				}
			}
		}
	}
}
