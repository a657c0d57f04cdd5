package peerdiscovery

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// recorder keeps the peer lists Watch delivers.
type recorder struct {
	mu    sync.Mutex
	lists [][]string
}

func (r *recorder) set(peers []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists = append(r.lists, peers)
}

func (r *recorder) waitFor(t *testing.T, want []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.mu.Lock()
		var last []string
		if n := len(r.lists); n > 0 {
			last = r.lists[n-1]
		}
		r.mu.Unlock()
		if slices.Equal(last, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("peers = %v, want %v", last, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func slice(name, service string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("peer"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

func ep(ip string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
}

// TestWatchFollowsReplicas drives EndpointSlices on a real API server and
// checks that replicas coming, turning unready and going are picked up.
func TestWatchFollowsReplicas(t *testing.T) {
	cp := controlplane.Get(t)
	cs := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "peers-test"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	// Another Service's endpoints must not show up.
	if _, err := slices.Create(ctx, slice("other-1", "other", 9000, ep("10.0.0.99", true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first, err := slices.Create(ctx, slice("backend-1", "backend-peers", 8091, ep("10.0.0.1", true), ep("10.0.0.2", true)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var r recorder
	if err := Watch(ctx, cs, Options{Namespace: ns, Service: "backend-peers", PortName: "peer"}, r.set); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, []string{"https://10.0.0.1:8091", "https://10.0.0.2:8091"})

	// A replica joins in a second slice.
	if _, err := slices.Create(ctx, slice("backend-2", "backend-peers", 8091, ep("10.0.0.3", true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, []string{"https://10.0.0.1:8091", "https://10.0.0.2:8091", "https://10.0.0.3:8091"})

	// One turns unready, then its slice goes away.
	first.Endpoints = []discoveryv1.Endpoint{ep("10.0.0.1", true), ep("10.0.0.2", false)}
	if _, err := slices.Update(ctx, first, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, []string{"https://10.0.0.1:8091", "https://10.0.0.3:8091"})
	if err := slices.Delete(ctx, "backend-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, []string{"https://10.0.0.3:8091"})
}

func TestPeers(t *testing.T) {
	s := slice("a", "svc", 8091, ep("10.0.0.2", true), ep("10.0.0.1", true), ep("10.0.0.9", false),
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.3"}}) // Ready unset: ready
	six := slice("b", "svc", 8091, ep("fd00::1", true))
	six.AddressType = discoveryv1.AddressTypeIPv6
	noPort := slice("c", "svc", 8091, ep("10.0.0.4", true))
	noPort.Ports[0].Name = ptr.To("metrics")
	got := Peers([]*discoveryv1.EndpointSlice{s, six, noPort, s}, "peer")
	want := []string{"https://10.0.0.1:8091", "https://10.0.0.2:8091", "https://10.0.0.3:8091", "https://[fd00::1]:8091"}
	if !slices.Equal(got, want) {
		t.Fatalf("Peers = %v, want %v", got, want)
	}
}
