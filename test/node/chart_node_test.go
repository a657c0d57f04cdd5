package node

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/localenv/node"
)

// TestGuard: the network guard is in place and has dropped nothing (each
// dropped packet is one that would have left the machine). TestMain
// checks it again after every other test.
func TestGuard(t *testing.T) {
	getNode(t)
	drops, err := node.GuardDrops()
	if err != nil {
		t.Fatal(err)
	}
	if drops != 0 {
		t.Fatalf("the network guard dropped %d packets:\n%s", drops, node.GuardListing())
	}
}

// TestChart installs the chart with its default values (two replicas) and
// runs it as a provider would: binds through the Service, a helm upgrade
// that rolls both pods under load, a frozen pod and a pod whose packets
// are dropped.
func TestChart(t *testing.T) {
	n := getNode(t)
	r := installChart(t, n)
	t.Run("PodsReadyThroughTheirProbes", func(t *testing.T) { testPodsReady(t, r) })
	t.Run("BindThroughTheService", func(t *testing.T) {
		start := time.Now()
		r.mustBind(t)
		t.Logf("FIGURE bind through the Service (session, login, Bind, delivery): %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("UpgradeUnderLoad", func(t *testing.T) { testUpgradeUnderLoad(t, r) })
	t.Run("FrozenPod", func(t *testing.T) { testFrozenPod(t, r) })
	t.Run("DroppedPodTraffic", func(t *testing.T) { testDroppedTraffic(t, r) })
}

func testPodsReady(t *testing.T, r *release) {
	ready := r.readyPods(t)
	if len(ready) != 2 {
		r.dumpPods(t)
		t.Fatalf("%d Ready backend pods, want the chart's default 2", len(ready))
	}
	for _, p := range ready {
		c := p.Spec.Containers[0]
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Port.String() != "diagnostics" {
			t.Errorf("pod %s: readiness probe %+v, want an HTTP probe on the diagnostics port", p.Name, c.ReadinessProbe)
		}
		if c.Image != backendImage {
			t.Errorf("pod %s runs %s, want %s", p.Name, c.Image, backendImage)
		}
		st := p.Status.ContainerStatuses[0]
		if st.RestartCount != 0 || !st.Ready {
			t.Errorf("pod %s: container ready %v after %d restarts (last end: %+v)", p.Name, st.Ready, st.RestartCount, st.LastTerminationState.Terminated)
			r.dumpPods(t)
		}
		// The probe's own endpoint, from the host as the kubelet asks it.
		resp, err := http.Get("http://" + p.Status.PodIP + ":9090/readyz")
		if err != nil {
			t.Errorf("pod %s: /readyz: %v", p.Name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("pod %s: /readyz %d", p.Name, resp.StatusCode)
		}
	}
}

// mustBind creates a session through the Service, binds it and polls the
// BindingResponse.
func (r *release) mustBind(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := r.newSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.bind(ctx, s); err != nil {
		t.Fatalf("session %s: %v", s.SessionID, err)
	}
	ns, err := s.deliver(ctx, 30*time.Second)
	if err != nil {
		t.Fatalf("session %s: %v", s.SessionID, err)
	}
	return ns
}

// load is pollers polling pending sessions and a binder binding through
// the Service, until stopped; every wrong answer or lost bind is kept.
type load struct {
	polls, binds atomic.Int64
	mu           sync.Mutex
	wrong        []string
	slowest      time.Duration
	slowestBind  time.Duration
	stop         context.CancelFunc
	done         sync.WaitGroup
}

func (l *load) wrongs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.wrong)
}

func (l *load) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.wrong) < 20 {
		l.wrong = append(l.wrong, fmt.Sprintf(format, args...))
	}
}

// startLoad starts pollers pending sessions, each polled a poll gap
// apart, and one binder.
func (r *release) startLoad(t *testing.T, pollers int) *load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{stop: cancel}
	for range pollers {
		s, err := r.newSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Within the backend's per-client rate of session creations
		// (10 a second; the binder needs some too).
		time.Sleep(150 * time.Millisecond)
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			for ctx.Err() == nil {
				start := time.Now()
				a := s.poll(ctx)
				took := time.Since(start)
				if ctx.Err() != nil {
					return
				}
				l.polls.Add(1)
				l.mu.Lock()
				l.slowest = max(l.slowest, took)
				l.mu.Unlock()
				if !a.pending() {
					l.fail("poll of a pending session: %s after %v", a, took.Round(time.Millisecond))
				}
				select {
				case <-ctx.Done():
				case <-time.After(pollGap):
				}
			}
		}()
	}
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		for ctx.Err() == nil {
			start := time.Now()
			s, err := r.newSession(ctx)
			if err == nil {
				err = r.bind(ctx, s)
			}
			if err == nil {
				_, err = s.deliver(ctx, 30*time.Second)
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				l.fail("bind: %v", err)
			} else {
				l.mu.Lock()
				l.slowestBind = max(l.slowestBind, time.Since(start))
				l.mu.Unlock()
				l.binds.Add(1)
			}
			// A bind costs three of the per-client rate (the session,
			// the authentication link, the callback).
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return l
}

// end stops the load and fails the test for every wrong answer. A bind
// takes seconds (a login, provisioning, a poll gap before delivery), more
// on a busy machine: end first lets the binder finish one, within a
// minute, so that the load has bound something under the fault.
func (l *load) end(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for l.binds.Load() == 0 && len(l.wrongs()) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	l.stop()
	l.done.Wait()
	for _, w := range l.wrong {
		t.Error(w)
	}
	t.Logf("%d polls (slowest %v), %d binds (slowest %v)", l.polls.Load(), l.slowest.Round(time.Millisecond), l.binds.Load(), l.slowestBind.Round(time.Millisecond))
	if l.polls.Load() == 0 || l.binds.Load() == 0 {
		t.Errorf("the load made %d polls and %d binds: it did not run", l.polls.Load(), l.binds.Load())
	}
}

func testUpgradeUnderLoad(t *testing.T, r *release) {
	before := podNames(r.readyPods(t))
	// Bound before the upgrade, delivered after it: outcomes outlive the
	// pods that recorded them.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var boundBefore []*session
	for range 3 {
		s, err := r.newSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.bind(ctx, s); err != nil {
			t.Fatal(err)
		}
		boundBefore = append(boundBefore, s)
	}
	l := r.startLoad(t, 50)
	time.Sleep(2 * pollGap)
	upgradeStart := time.Now()
	took := r.upgrade(t, "podAnnotations.rollout=at-"+time.Now().Format("150405"))
	t.Logf("FIGURE helm upgrade --wait rolling both pods under load: %v", took.Round(time.Millisecond))
	// The load goes on until the old pods are gone: through their preStop
	// sleep, SIGTERM and drain.
	waitFor(t, 2*time.Minute, "the old pods to be gone", func() bool {
		pods, err := r.kube.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		return !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return slices.Contains(before, p.Name) })
	})
	t.Logf("FIGURE the old pods were gone %v after the upgrade began", time.Since(upgradeStart).Round(time.Millisecond))
	time.Sleep(2 * pollGap)
	l.end(t)
	after := podNames(r.readyPods(t))
	if len(after) != 2 || slices.ContainsFunc(after, func(p string) bool { return slices.Contains(before, p) }) {
		t.Errorf("pods before the upgrade %v, after %v: want two new ones", before, after)
	}
	for _, s := range boundBefore {
		if _, err := s.deliver(ctx, 10*time.Second); err != nil {
			t.Errorf("a bind made before the upgrade is lost: %v", err)
		}
	}
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

// podCgroup is the pod's folder in the freezer hierarchy.
func podCgroup(t *testing.T, p corev1.Pod) string {
	t.Helper()
	var matches []string
	_ = filepath.WalkDir("/sys/fs/cgroup/freezer/kbb-node", func(path string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() && e.Name() == "pod"+string(p.UID) {
			matches = append(matches, path)
		}
		return nil
	})
	if len(matches) != 1 {
		t.Fatalf("pod %s: freezer cgroup %v", p.Name, matches)
	}
	return matches[0]
}

// testFrozenPod freezes one backend pod (its cgroup, as a stopped VM or
// a stuck node would): it fails its readiness probe and leaves the
// Service; polls and binds go on through the Service, none answered
// wrongly.
func testFrozenPod(t *testing.T, r *release) {
	pods := r.readyPods(t)
	if len(pods) != 2 {
		t.Fatalf("%d Ready pods", len(pods))
	}
	victim := pods[0]
	cg := podCgroup(t, victim)
	state := filepath.Join(cg, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = os.WriteFile(state, []byte("THAWED"), 0o644)
		}
	}
	defer thaw()
	frozenAt := time.Now()
	// Until the probe fails, the Service still sends a share of the
	// requests to the frozen pod: those wait. Then none do.
	left := waitFor(t, 60*time.Second, "the frozen pod to leave the Ready pods", func() bool {
		return !slices.Contains(podNames(r.readyPods(t)), victim.Name)
	})
	t.Logf("the frozen pod was no longer Ready after %v", left.Round(time.Millisecond))
	time.Sleep(2 * time.Second) // kube-proxy's rules follow the endpoints
	l := r.startLoad(t, 10)
	time.Sleep(5 * pollGap)
	l.end(t)
	if l.slowest > 3*time.Second {
		t.Errorf("slowest poll with a frozen replica took %v; the promise is 1 to 2 s", l.slowest)
	}
	thaw()
	t.Logf("frozen for %v in all", time.Since(frozenAt).Round(time.Millisecond))
	// Its liveness probe may have failed meanwhile: then the kubelet
	// restarts the container once it thaws.
	r.settle(t)
}

// settle waits until both pods are Ready and stay so, without a restart,
// for longer than a liveness period.
func (r *release) settle(t *testing.T) {
	t.Helper()
	state := func() string {
		var s []string
		for _, p := range r.readyPods(t) {
			s = append(s, fmt.Sprintf("%s/%d", p.Name, p.Status.ContainerStatuses[0].RestartCount))
		}
		slices.Sort(s)
		return strings.Join(s, ",")
	}
	last, since := "", time.Now()
	waitFor(t, 2*time.Minute, "both pods Ready without a restart for 12 s", func() bool {
		cur := state()
		if cur != last {
			last, since = cur, time.Now()
		}
		return strings.Count(cur, ",") == 1 && time.Since(since) > 12*time.Second
	})
	t.Logf("pods settled: %s", last)
}

// testDroppedTraffic drops every packet between the two backend pods
// (nft rules on their addresses only): both stay Ready (the kubelet and
// the Service reach them from the host), each answers on its own within
// the peer timeout, and binds go on.
func testDroppedTraffic(t *testing.T, r *release) {
	pods := r.readyPods(t)
	if len(pods) != 2 {
		t.Fatalf("%d Ready pods", len(pods))
	}
	a, b := pods[0].Status.PodIP, pods[1].Status.PodIP
	for _, ip := range []string{a, b} {
		if !strings.HasPrefix(ip, strings.TrimSuffix(node.PodCIDR, "0/24")) {
			t.Fatalf("pod address %s is outside the pod range %s: no rule for it", ip, node.PodCIDR)
		}
	}
	const table = "kbb_node_test_cut"
	rules := fmt.Sprintf(`table inet %s {
	chain forward {
		type filter hook forward priority filter - 20; policy accept;
		ip saddr %s ip daddr %s counter drop
		ip saddr %s ip daddr %s counter drop
	}
}
`, table, a, b, b, a)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	defer exec.Command("nft", "delete", "table", "inet", table).Run()
	l := r.startLoad(t, 20)
	time.Sleep(6 * pollGap)
	l.end(t)
	if l.slowest > 3*time.Second {
		t.Errorf("slowest poll with the pods cut off from each other took %v; the promise is 1 to 2 s", l.slowest)
	}
	out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "counter packets") || strings.Count(string(out), "counter packets 0 ") == 2 {
		t.Errorf("the rules dropped nothing: the pods never talked to each other?\n%s", out)
	}
	if n := len(r.readyPods(t)); n != 2 {
		t.Errorf("%d Ready pods while their packets to each other are dropped, want 2", n)
	}
}

// waitFor polls cond every 200 ms until it holds and returns how long that
// took; it fails the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start)
}
