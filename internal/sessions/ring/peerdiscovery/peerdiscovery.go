// Package peerdiscovery finds the replicas of the backend from the
// EndpointSlices of a headless Service and keeps the session ring's peer
// list current as replicas come and go, without restarts.
package peerdiscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Options say which Service's endpoints are the peers.
type Options struct {
	Namespace string
	// Service is the name of the headless Service selecting the replicas.
	Service string
	// PortName is the name of the Service port of the peer API; empty
	// takes the slice's only port.
	PortName string
}

// Watch keeps calling set with the peer base URLs (https://ip:port,
// sorted) of the ready endpoints of the Service, until ctx ends. It
// returns once the first list was delivered, or with an error if the
// informer cannot sync.
func Watch(ctx context.Context, client kubernetes.Interface, opts Options, set func(peers []string)) error {
	synced := make(chan error, 1)
	go func() { _ = watch(ctx, client, opts, set, synced) }()
	return <-synced
}

// Run keeps calling set like Watch, until ctx ends, and returns only
// then: a failed sync is logged and tried again after retry (the API
// server may be away at start-up).
func Run(ctx context.Context, client kubernetes.Interface, opts Options, set func(peers []string), retry time.Duration, log *slog.Logger) {
	for ctx.Err() == nil {
		err := watch(ctx, client, opts, set, nil)
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Warn("peer discovery failed; retrying", "error", err, "retryIn", retry)
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// watch follows the EndpointSlices until ctx ends (nil) or the informer
// cannot sync (the error). synced, if not nil, is told either way once
// the first list was delivered or the sync failed.
func watch(ctx context.Context, client kubernetes.Interface, opts Options, set func(peers []string), synced chan<- error) error {
	tell := func(err error) error {
		if synced != nil {
			synced <- err
			synced = nil
		}
		return err
	}
	if opts.Namespace == "" || opts.Service == "" {
		return tell(errors.New("peerdiscovery: namespace and service are required"))
	}
	selector := labels.Set{discoveryv1.LabelServiceName: opts.Service}.AsSelector().String()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Discovery().V1().EndpointSlices()
	lister := inf.Lister().EndpointSlices(opts.Namespace)

	// Events only say "something changed": the peer list is recomputed
	// from the informer's cache, in one goroutine, so calls to set never
	// interleave and the last one wins.
	changed := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, o any) { notify(o) },
		DeleteFunc: notify,
	}); err != nil {
		return tell(err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return tell(fmt.Errorf("peerdiscovery: EndpointSlices of %s/%s did not sync", opts.Namespace, opts.Service))
	}
	var last []string
	publish := func() {
		items, err := lister.List(labels.Everything())
		if err != nil {
			return
		}
		peers := Peers(items, opts.PortName)
		if last == nil || !equal(peers, last) {
			last = peers
			set(peers)
		}
	}
	publish()
	_ = tell(nil)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			publish()
		}
	}
}

func equal(a, b []string) bool { return slices.Equal(a, b) }

// Peers returns the sorted, distinct peer URLs (https: the peer API is
// served with TLS only) of the ready endpoints in the slices.
func Peers(eps []*discoveryv1.EndpointSlice, portName string) []string {
	peers := []string{}
	for _, s := range eps {
		port, ok := slicePort(s, portName)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			// Ready unset means ready (the API's convention).
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				peers = append(peers, "https://"+net.JoinHostPort(addr, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(peers)
	return slices.Compact(peers)
}

func slicePort(s *discoveryv1.EndpointSlice, name string) (int32, bool) {
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if (name == "" && len(s.Ports) == 1) || (p.Name != nil && *p.Name == name) {
			return *p.Port, true
		}
	}
	return 0, false
}
