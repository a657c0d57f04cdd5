package scale

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/apirequests"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

const (
	namespacePrefix = "kb-scale-"
	issuer          = "https://idp.scale.example"
	clusterID       = "scale-cluster"
	backendUser     = "kube-bind-backend-scale"
	// workers bind consumers at once: enough to keep the API server busy.
	workers = 16
	// newBinds are timed one after another once all consumers are bound.
	newBinds = 5
	// heartbeatEvery is how often the released konnector (v0.8) writes
	// its ClusterBinding's heartbeat: half its 5-minute interval.
	heartbeatEvery = 150 * time.Second
)

var mango = exampleapis.MangoDB

// With N consumers bound (KUBE_BIND_SCALE_CONSUMERS, default 200) before
// two replicas start: the leader answers every consumer's request and
// reports every credential valid, each replica stays under the chart's
// memory limit, new binds among them complete at rest and while a new
// leader catches up, a settled handover writes nothing, and one rotation
// of every credential reaches every kubeconfig Secret. Durations, memory,
// CPU and request counts are logged as figures ("figure:" lines) and
// checked against bounds that grow with N (see settleBound and below).
func TestConsumersAtScale(t *testing.T) {
	n := envInt(t, "KUBE_BIND_SCALE_CONSUMERS", 200)
	window := envDuration(t, "KUBE_BIND_SCALE_REST", 20*time.Second)
	ctx := context.Background()
	cp := controlplane.Get(t)
	createSchemaCRD(t, cp, envInt(t, schemaKiBEnv, 64))
	s := newScale(t, cp)

	// The consumers, bound before the backend starts: a new leader finds
	// them all at once.
	start := time.Now()
	if err := parallel(n, workers, func(i int) error { _, err := s.bind(ctx, i); return err }); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	figure(t, "bound %d consumers (Provision and one request each, %d at once) in %s: %.0f binds/s",
		n, workers, took.Round(time.Second), float64(n)/took.Seconds())

	limit := backendproc.ChartMemoryLimit(t)
	start = time.Now()
	reps := startReplicas(t, cp, limit)
	leader, follower := waitLeader(t, reps...)
	s.waitSettled(t, n, time.Now().Add(settleTimeout(n)))
	took = time.Since(start)
	figure(t, "the leader answered all %d requests and reported every credential valid %s after the replicas started",
		n, took.Round(time.Second))
	if b := settleBound(n); took > b {
		t.Errorf("a new leader took %s to answer every request and report every credential; the bound at %d consumers is %s",
			took.Round(time.Second), n, b)
	}

	time.Sleep(5 * time.Second) // the last events, and a GC cycle
	for _, r := range []*replica{leader, follower} {
		rss, peak := procs.Memory(t, r.PID)
		figure(t, "%s with %d consumers: VmRSS %.1f MiB, peak VmHWM %.1f MiB (chart limit %.0f MiB)",
			r.role, n, mib(rss), mib(peak), mib(limit))
		checkMemory(t, r, n, peak, limit)
		saveHeapProfile(t, r, fmt.Sprintf("%d-settled", n))
	}

	for _, r := range []*replica{leader, follower} {
		mc := procs.CPUMillicores(t, r.PID, window)
		figure(t, "%s at rest, no heartbeats: %.1f millicores over %s", r.role, mc, window)
		checkCPU(t, r, n, mc, "with no heartbeats")
	}
	stopHeartbeats := s.heartbeats(ctx, n)
	time.Sleep(heartbeatEvery / 10) // every konnector's first heartbeats have begun
	both := []*replica{leader, follower}
	cpus := make([]float64, len(both))
	var wg sync.WaitGroup
	for i, r := range both {
		wg.Go(func() { cpus[i] = procs.CPUMillicores(t, r.PID, window) })
	}
	wg.Wait()
	beats := stopHeartbeats()
	for i, r := range both {
		figure(t, "%s at rest with every konnector's heartbeat (%.1f/s): %.1f millicores over %s",
			r.role, float64(n)/heartbeatEvery.Seconds(), cpus[i], window)
		checkCPU(t, r, n, cpus[i], "with every konnector's heartbeat")
	}
	if beats == 0 {
		t.Errorf("no heartbeat was written")
	}

	// New binds among the n, at rest.
	s.newBinds(t, n, n, "at rest", leader, restBindBounds())
	total := n + newBinds
	s.waitSettled(t, total, time.Now().Add(settleTimeout(total)))

	// A handover with everything settled: the follower takes over and
	// finds nothing to do. What it asks of the API server is counted.
	leader, follower = s.settledHandover(t, leader, follower, total)

	// A handover with new binds made while the new leader catches up.
	leader.Stop()
	next, _ := waitLeader(t, follower)
	s.newBinds(t, total, total, "during a new leader's catch-up", next, catchUpBindBounds(total))
	leader, follower = next, leader.restart(t)
	total += newBinds
	s.waitSettled(t, total, time.Now().Add(settleTimeout(total)))

	// One rotation of every credential, asked for on every ClusterBinding
	// at once, until every kubeconfig Secret names a new token.
	before := s.kubeconfigTokens(t)
	if len(before) != total {
		t.Fatalf("%d kubeconfig Secrets, want %d", len(before), total)
	}
	// The request must be later than every issue time (whole seconds).
	time.Sleep(1100 * time.Millisecond)
	stamp := time.Now().UTC().Format(time.RFC3339)
	start = time.Now()
	if err := s.askRotation(ctx, stamp); err != nil {
		t.Fatal(err)
	}
	annotated := time.Since(start)
	s.waitRotated(t, before, start.Add(rotationTimeout(total)))
	took = time.Since(start)
	figure(t, "rotated all %d credentials in %s (%.1f/s; annotating every ClusterBinding took %s of it)",
		total, took.Round(time.Second), float64(total)/took.Seconds(), annotated.Round(time.Second))
	if b := rotationBound(total); took > b {
		t.Errorf("rotating %d credentials took %s; the bound is %s", total, took.Round(time.Second), b)
	}
	for _, r := range []*replica{leader, follower} {
		rss, peak := procs.Memory(t, r.PID)
		figure(t, "%s after the rotation: VmRSS %.1f MiB, peak VmHWM %.1f MiB", r.role, mib(rss), mib(peak))
		checkMemory(t, r, total, peak, limit)
	}
}

// newBinds times newBinds binds among n consumers, one after another,
// numbered from first: Provision, then the konnector's request until it
// is answered and its APIServiceExport exists.
func (s *scale) newBinds(t *testing.T, n, first int, when string, leader *replica, b bindBounds) {
	t.Helper()
	ctx := context.Background()
	provBefore, leaderBefore := s.provRequests.Counts(), apiRequests(t, leader)
	var provisions, answers []time.Duration
	for i := range newBinds {
		t0 := time.Now()
		ns, err := s.provision(ctx, first+i)
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := s.request(ctx, ns); err != nil {
			t.Fatal(err)
		}
		s.waitAnswered(t, ns, 2*time.Minute)
		provisions, answers = append(provisions, t1.Sub(t0)), append(answers, time.Since(t1))
	}
	figure(t, "a new bind among %d, %s: Provision p50 %s max %s, its request answered with an APIServiceExport p50 %s max %s (of %d; all: %v / %v)",
		n, when, median(provisions), slices.Max(provisions).Round(time.Millisecond),
		median(answers), slices.Max(answers).Round(time.Millisecond), newBinds, provisions, answers)
	provCounts := requestCounts{}
	for k, v := range s.provRequests.Counts() {
		if d := v - provBefore[k]; d > 0 {
			provCounts[[2]string{k.Verb, k.Resource}] = float64(d)
		}
	}
	leaderCounts := apiRequests(t, leader).minus(leaderBefore)
	figure(t, "API requests of %d new binds %s: Provision %.0f (%s); the leader until it answered them %.0f (%s)", newBinds, when,
		provCounts.sum(func(string, string) bool { return true }), provCounts, leaderCounts.sum(ofConsumers), leaderCounts)
	for _, c := range []struct {
		what     string
		ds       []time.Duration
		p50, max time.Duration
	}{{"Provision", provisions, b.provisionP50, b.provisionMax}, {"request to export", answers, b.answerP50, b.answerMax}} {
		if p50, m := median(c.ds), slices.Max(c.ds); p50 > c.p50 || m > c.max {
			t.Errorf("a new bind among %d %s: %s p50 %s, max %s; the bounds are %s and %s", n, when, c.what, p50, m.Round(time.Millisecond), c.p50, c.max)
		}
	}
}

// settledHandover stops the leader of a settled provider and lets the
// follower take over: it must catch up within catchUpBound, and what it
// asks of the API server meanwhile must not grow with the consumers:
// lists and watches, no writes, no GET per consumer. It returns the new
// leader and the old one, started again as the follower.
func (s *scale) settledHandover(t *testing.T, leader, follower *replica, n int) (*replica, *replica) {
	t.Helper()
	before := apiRequests(t, follower)
	stopped := time.Now()
	leader.Stop()
	next, _ := waitLeader(t, follower)
	elected := time.Now()
	last := waitQuiet(t, next, catchUpTimeout(n))
	counts := apiRequests(t, next).minus(before)
	figure(t, "a settled handover among %d consumers: elected %s after the leader stopped, its last request %s after that; its requests: %s",
		n, elected.Sub(stopped).Round(100*time.Millisecond), last.Sub(elected).Round(100*time.Millisecond), counts)
	if took, b := last.Sub(elected), catchUpBound(n); took > b {
		t.Errorf("the new leader of a settled provider made requests for %s; the bound at %d consumers is %s", took.Round(time.Second), n, b)
	}
	if w := counts.writes(); len(w) > 0 {
		t.Errorf("a settled handover wrote: %s; want no write", w)
	}
	if g, b := counts.sum(isGet), handoverGetBound(n); g > b {
		t.Errorf("a settled handover made %.0f GETs (%s); the bound at %d consumers is %.0f", g, counts, n, b)
	}
	if l, b := counts.sum(isListOrWatch), handoverListBound(n); l > b {
		t.Errorf("a settled handover made %.0f lists and watches (%s); the bound at %d consumers is %.0f", l, counts, n, b)
	}
	return next, leader.restart(t)
}

// scale holds the clients of a run.
type scale struct {
	prov *binding.Provisioner
	// provRequests counts the provisioner's requests.
	provRequests *apirequests.Counter
	dyn          dynamic.Interface
	kube         kubernetes.Interface
}

func newScale(t *testing.T, cp *controlplane.ControlPlane) *scale {
	t.Helper()
	// The provisioner runs as a user holding only the backend's
	// ClusterRole, as the backend does; unthrottled, as the point is to
	// make the objects quickly.
	rc := rest.CopyConfig(backendcluster.Backend(t, cp, backendUser, mango))
	rc.QPS, rc.Burst = 1000, 2000
	counter := apirequests.New("scale", "the provisioner's requests")
	rc.Wrap(counter.Wrap)
	cat := backendcluster.Catalog(t, rc, mango)
	prov, err := binding.NewProvisioner(rc, cat, binding.Config{NamespacePrefix: namespacePrefix, ProviderPrettyName: "Scale provider"})
	if err != nil {
		t.Fatal(err)
	}
	admin := rest.CopyConfig(cp.AdminConfig())
	admin.QPS, admin.Burst = 1000, 2000
	return &scale{prov: prov, provRequests: counter, dyn: dynamic.NewForConfigOrDie(admin), kube: kubernetes.NewForConfigOrDie(admin)}
}

// bind binds consumer i and makes its konnector's request.
func (s *scale) bind(ctx context.Context, i int) (string, error) {
	ns, err := s.provision(ctx, i)
	if err != nil {
		return "", err
	}
	return ns, s.request(ctx, ns)
}

func (s *scale) provision(ctx context.Context, i int) (string, error) {
	c := binding.Consumer{Issuer: issuer, Subject: fmt.Sprintf("consumer-%05d", i)}
	res, err := s.prov.Provision(ctx, c, clusterID, []binding.Resource{mango.Resource()})
	if err != nil {
		return "", fmt.Errorf("consumer %d: %w", i, err)
	}
	return res.Namespace, nil
}

// request makes the APIServiceExportRequest the konnector makes for the
// bound API.
func (s *scale) request(ctx context.Context, ns string) error {
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha2", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": mango.Name()},
		"spec": map[string]any{"resources": []any{map[string]any{
			"group": mango.Group, "resource": mango.Plural, "versions": []any{exampleapis.Version},
		}}},
	}}
	_, err := s.dyn.Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(ns).Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("request in %s: %w", ns, err)
	}
	return nil
}

// waitSettled waits until every one of the n consumers has its request
// Succeeded, its APIServiceExport, and CredentialsValid=True on its
// ClusterBinding.
func (s *scale) waitSettled(t *testing.T, n int, deadline time.Time) {
	t.Helper()
	ctx := context.Background()
	for {
		succeeded, exported, valid := 0, 0, 0
		err := listAll(ctx, s.dyn.Resource(kbresources.APIServiceExportRequestsV1alpha2), func(u *unstructured.Unstructured) {
			if p, _, _ := unstructured.NestedString(u.Object, "status", "phase"); p == exportrequests.PhaseSucceeded && ours(u) {
				succeeded++
			}
		})
		if err == nil {
			err = listAll(ctx, s.dyn.Resource(kbresources.APIServiceExportsV1alpha2), func(u *unstructured.Unstructured) {
				if u.GetName() == mango.Name() && ours(u) {
					exported++
				}
			})
		}
		if err == nil {
			err = listAll(ctx, s.dyn.Resource(kbresources.ClusterBindings), func(u *unstructured.Unstructured) {
				if ours(u) && credentialsValid(u) {
					valid++
				}
			})
		}
		if err == nil && succeeded == n && exported == n && valid == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("of %d consumers, %d requests succeeded, %d exports made, %d credentials reported valid (last error: %v)",
				n, succeeded, exported, valid, err)
		}
		time.Sleep(pollEvery(n))
	}
}

func ours(u *unstructured.Unstructured) bool {
	return strings.HasPrefix(u.GetNamespace(), namespacePrefix)
}

func credentialsValid(cb *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == credentials.ConditionType {
			return m["status"] == "True"
		}
	}
	return false
}

// waitAnswered polls (every 10 ms, as an impatient konnector) until the
// request in ns succeeded and its APIServiceExport exists.
func (s *scale) waitAnswered(t *testing.T, ns string, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		req, err := s.dyn.Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(ns).Get(ctx, mango.Name(), metav1.GetOptions{})
		if err == nil {
			if p, _, _ := unstructured.NestedString(req.Object, "status", "phase"); p == exportrequests.PhaseSucceeded {
				if _, err = s.dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Get(ctx, mango.Name(), metav1.GetOptions{}); err == nil {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the request in %s was not answered with an export within %s (last error: %v)", ns, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// heartbeats writes each consumer's ClusterBinding heartbeat every
// heartbeatEvery, spread evenly, as n konnectors would, until the returned
// function is called; it returns how many were written.
func (s *scale) heartbeats(ctx context.Context, n int) (stop func() int) {
	nss := make([]string, 0, n)
	_ = listAll(ctx, s.dyn.Resource(kbresources.ClusterBindings), func(u *unstructured.Unstructured) {
		if ours(u) {
			nss = append(nss, u.GetNamespace())
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	const beaters = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	written := 0
	gap := heartbeatEvery * beaters / time.Duration(max(len(nss), 1))
	for b := range beaters {
		wg.Go(func() {
			tick := time.NewTicker(gap)
			defer tick.Stop()
			for i := b; ; i += beaters {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				ns := nss[i%len(nss)]
				patch := fmt.Sprintf(`{"status":{"lastHeartbeatTime":%q,"heartbeatInterval":"5m0s"}}`, time.Now().UTC().Format(time.RFC3339))
				_, err := s.dyn.Resource(kbresources.ClusterBindings).Namespace(ns).Patch(ctx, binding.ClusterBindingName,
					types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
				if err == nil {
					mu.Lock()
					written++
					mu.Unlock()
				}
			}
		})
	}
	return func() int { cancel(); wg.Wait(); return written }
}

// kubeconfigTokens maps each consumer namespace to the token Secret its
// kubeconfig Secret names.
func (s *scale) kubeconfigTokens(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	opts := metav1.ListOptions{FieldSelector: "metadata.name=" + binding.KubeconfigSecretName, Limit: 500}
	for {
		list, err := s.kube.CoreV1().Secrets("").List(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range list.Items {
			if strings.HasPrefix(sec.Namespace, namespacePrefix) {
				out[sec.Namespace] = sec.Annotations[binding.AnnotationTokenSecret]
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out
		}
	}
}

// askRotation sets the rotation annotation on every consumer's
// ClusterBinding, as an operator would with kubectl annotate.
func (s *scale) askRotation(ctx context.Context, stamp string) error {
	var nss []string
	if err := listAll(ctx, s.dyn.Resource(kbresources.ClusterBindings), func(u *unstructured.Unstructured) {
		if ours(u) {
			nss = append(nss, u.GetNamespace())
		}
	}); err != nil {
		return err
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, credentials.AnnotationRotate, stamp)
	return parallel(len(nss), workers, func(i int) error {
		_, err := s.dyn.Resource(kbresources.ClusterBindings).Namespace(nss[i]).Patch(ctx, binding.ClusterBindingName,
			types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// waitRotated waits until every kubeconfig Secret of before names another
// token.
func (s *scale) waitRotated(t *testing.T, before map[string]string, deadline time.Time) {
	t.Helper()
	for {
		now := s.kubeconfigTokens(t)
		left := 0
		for ns, tok := range before {
			if now[ns] == tok {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d kubeconfig Secrets still name their old token", left, len(before))
		}
		time.Sleep(pollEvery(len(before)))
	}
}

// replica is one backend process.
type replica struct {
	*backendproc.Process
	role string // "leader" or "follower", once known
	base string
	args []string
}

// startReplicas starts two backends, leader election on, with the
// chart's memory limit.
func startReplicas(t *testing.T, cp *controlplane.ControlPlane, limit int64) []*replica {
	t.Helper()
	ports := []int{procs.FreePort(t), procs.FreePort(t)}
	var redirects []string
	for _, p := range ports {
		redirects = append(redirects, fmt.Sprintf("http://127.0.0.1:%d/callback", p))
	}
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: redirects})
	var reps []*replica
	for _, port := range ports {
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		args := append(backendproc.BrowserArgs(t, port, base, idp, cp.AdminKubeconfigPath(), "Scale provider", namespacePrefix),
			"--memory-limit", strconv.FormatInt(limit, 10),
			"--leader-election-namespace", "default")
		args = append(args, backendproc.DiagnosticsArgs(t)...)
		if os.Getenv(profilesEnv) != "" {
			args = append(args, "--profiling")
		}
		r := &replica{base: base, args: args}
		r.Process = backendproc.StartBinary(t, backendproc.Binary, base, args, 2*time.Minute)
		reps = append(reps, r)
	}
	return reps
}

// profilesEnv names a folder for each replica's heap profile once
// settled (`go tool pprof -sample_index=inuse_space <file>`): where a
// consumer's bytes go.
const profilesEnv = "KUBE_BIND_SCALE_PROFILES"

// saveHeapProfile writes r's heap profile, after a collection, to the
// folder profilesEnv names, if any.
func saveHeapProfile(t *testing.T, r *replica, when string) {
	t.Helper()
	dir := os.Getenv(profilesEnv)
	if dir == "" {
		return
	}
	resp, err := http.Get(r.Diagnostics + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s heap profile: %d %v", r.role, resp.StatusCode, err)
	}
	path := filepath.Join(dir, fmt.Sprintf("heap-%s-%s.pb.gz", r.role, when))
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
	figure(t, "%s heap profile: %s", r.role, path)
}

// restart starts a stopped replica again with the same flags, as a
// follower.
func (r *replica) restart(t *testing.T) *replica {
	t.Helper()
	return &replica{
		Process: backendproc.StartBinary(t, backendproc.Binary, r.base, r.args, 2*time.Minute),
		role:    "follower", base: r.base, args: r.args,
	}
}

// waitLeader finds which of reps leads; the others follow.
func waitLeader(t *testing.T, reps ...*replica) (leader, follower *replica) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		for i, r := range reps {
			if leading.MatchString(r.Logs.String()) {
				leader, r.role = r, "leader"
				if len(reps) > 1 {
					follower = reps[1-i]
					follower.role = "follower"
				}
				return leader, follower
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no replica became leader within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leading matches what a replica logs when it becomes the leader.
var leading = regexp.MustCompile(`leader election: (became leader|leading)`)

// requestCounts are a replica's API requests by verb and resource
// (kube_bind_backend_api_requests_total).
type requestCounts map[[2]string]float64

// apiRequests reads r's request counter from its /metrics.
func apiRequests(t *testing.T, r *replica) requestCounts {
	t.Helper()
	resp, err := http.Get(r.Diagnostics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := requestCounts{}
	for _, m := range requestLine.FindAllStringSubmatch(string(body), -1) {
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("%s: %v", m[0], err)
		}
		out[[2]string{m[2], m[1]}] = v
	}
	if len(out) == 0 {
		t.Fatalf("%s serves no kube_bind_backend_api_requests_total", r.role)
	}
	return out
}

var requestLine = regexp.MustCompile(`(?m)^kube_bind_backend_api_requests_total\{resource="([^"]*)",verb="([^"]*)"\} (\S+)$`)

func (c requestCounts) minus(before requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// sum adds the counts of the verbs and resources match takes.
func (c requestCounts) sum(match func(verb, resource string) bool) float64 {
	var n float64
	for k, v := range c {
		if match(k[0], k[1]) {
			n += v
		}
	}
	return n
}

// ofConsumers: the provider's own requests, not leader election's
// (leases) nor discovery's (no resource).
func ofConsumers(_, resource string) bool { return resource != "" && resource != "leases" }

func isGet(verb, resource string) bool { return verb == "get" && ofConsumers(verb, resource) }

func isListOrWatch(verb, resource string) bool {
	return (verb == "list" || verb == "watch") && ofConsumers(verb, resource)
}

// writes are the counts of requests that change something, but for
// leader election's and the identity reviews that change nothing.
func (c requestCounts) writes() requestCounts {
	out := requestCounts{}
	for k, v := range c {
		switch k[0] {
		case "get", "list", "watch":
			continue
		}
		if !ofConsumers(k[0], k[1]) || k[1] == "selfsubjectreviews" {
			continue
		}
		out[k] = v
	}
	return out
}

func (c requestCounts) String() string {
	keys := slices.Collect(maps.Keys(c))
	slices.SortFunc(keys, func(a, b [2]string) int { return strings.Compare(a[1]+" "+a[0], b[1]+" "+b[0]) })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s %.0f", k[0], k[1], c[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// waitQuiet waits until r has sent no request of the provider's own
// (ofConsumers) for quietFor, and returns when it sent its last one.
func waitQuiet(t *testing.T, r *replica, within time.Duration) time.Time {
	t.Helper()
	const quietFor = 10 * time.Second
	deadline := time.Now().Add(within)
	last, lastChange := -1.0, time.Now()
	for {
		now := apiRequests(t, r).sum(ofConsumers)
		if now != last {
			last, lastChange = now, time.Now()
		}
		if time.Since(lastChange) >= quietFor {
			return lastChange
		}
		if time.Now().After(deadline) {
			t.Errorf("%s still sends requests %s after becoming leader", r.role, within)
			return lastChange
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// listAll lists a resource in every namespace, 500 at a time.
func listAll(ctx context.Context, r dynamic.NamespaceableResourceInterface, each func(*unstructured.Unstructured)) error {
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := r.List(ctx, opts)
		if err != nil {
			return err
		}
		for i := range list.Items {
			each(&list.Items[i])
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			return nil
		}
	}
}

// parallel runs do(0..n-1) on at most w goroutines and returns the first
// error (the others still finish).
func parallel(n, w int, do func(i int) error) error {
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range w {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// Timeouts that grow with n: a failure is a consumer left behind, not a
// slow machine.
func settleTimeout(n int) time.Duration { return 5*time.Minute + time.Duration(n)*200*time.Millisecond }
func rotationTimeout(n int) time.Duration {
	return 5*time.Minute + time.Duration(n)*500*time.Millisecond
}
func catchUpTimeout(n int) time.Duration {
	return 5*time.Minute + time.Duration(n)*100*time.Millisecond
}
func pollEvery(n int) time.Duration { return max(time.Second, time.Duration(n)*time.Millisecond) }

// The bounds each run checks: a fixed allowance for a busy machine of two
// shared cores (start-up, the API server's own pace) plus a budget per
// consumer. At the CI's count the allowance dominates, so a slow machine
// passes; work that grows with the consumers at more than the budget
// fails at any count, and at the CI's count when it is large (a request
// or a write per consumer on a handover, a new request queued behind
// every consumer).

// settleBound: new leader, start to every request answered and every
// credential reported.
func settleBound(n int) time.Duration { return 150*time.Second + time.Duration(n)*60*time.Millisecond }

// catchUpBound: a new leader of a settled provider, election to its last
// request.
func catchUpBound(n int) time.Duration { return 30*time.Second + time.Duration(n)*20*time.Millisecond }

// rotationBound: rotating every credential once. A rotation costs about
// 8 requests of the controllers' 200/s (docs/scale.md): 40 ms each at
// the budget, 50 ms allowed.
func rotationBound(n int) time.Duration {
	return 60*time.Second + time.Duration(n)*50*time.Millisecond
}

// handoverGetBound and handoverListBound: the requests of a settled
// handover. A list is paged (500 a page) and each kind is listed and
// watched once; a GET is for something of the provider's own, never per
// consumer.
func handoverGetBound(n int) float64  { return max(10, float64(n)/20) }
func handoverListBound(n int) float64 { return 60 + float64(n)/50 }

// memoryBound: a replica's peak RSS.
func memoryBound(n int) int64 { return 100<<20 + int64(n)*16<<10 }

// cpuBound: a replica's CPU at rest, in millicores: the events of n
// consumers' heartbeats and nothing that runs per consumer on a clock.
func cpuBound(n int) float64 { return 50 + float64(n)/2 }

// bindBounds are the bounds of new binds' p50 and max.
type bindBounds struct{ provisionP50, provisionMax, answerP50, answerMax time.Duration }

// restBindBounds: a new bind with everything settled does not depend on
// how many consumers there are.
func restBindBounds() bindBounds {
	return bindBounds{provisionP50: time.Second, provisionMax: 15 * time.Second, answerP50: time.Second, answerMax: 15 * time.Second}
}

// catchUpBindBounds: a new request while a new leader catches up is
// answered before the backlog, not behind it.
func catchUpBindBounds(n int) bindBounds {
	perConsumer := time.Duration(n) * time.Millisecond
	return bindBounds{provisionP50: time.Second, provisionMax: 15 * time.Second,
		answerP50: 2*time.Second + perConsumer, answerMax: 5*time.Second + 2*perConsumer}
}

func checkMemory(t *testing.T, r *replica, n int, peak, limit int64) {
	t.Helper()
	if peak >= limit {
		t.Errorf("%s: peak VmHWM %.1f MiB reaches the chart's memory limit %.0f MiB", r.role, mib(peak), mib(limit))
	}
	if b := memoryBound(n); peak > b {
		t.Errorf("%s: peak VmHWM %.1f MiB with %d consumers; the bound is %.0f MiB", r.role, mib(peak), n, mib(b))
	}
}

func checkCPU(t *testing.T, r *replica, n int, mc float64, when string) {
	t.Helper()
	if b := cpuBound(n); mc > b {
		t.Errorf("%s at rest %s: %.1f millicores with %d consumers; the bound is %.0f", r.role, when, mc, n, b)
	}
}

func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("figure: "+format, args...)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 60s", name, v)
	}
	return d
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
