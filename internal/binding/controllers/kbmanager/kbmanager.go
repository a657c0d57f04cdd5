// Package kbmanager runs the provider-side controllers on one
// controller-runtime manager: one cache in which every kind the
// controllers read is listed, watched and trimmed once (Kinds), one
// request budget for all their clients (Budgeted) and leader election on a
// Lease. controller-runtime's priority queue works through the objects of
// the initial list after every new or changed one (usePriorityQueue).
//
// A controller is added by a Setup, called for every leadership term
// with that term's *Manager:
//
//   - reads go to m.GetCache() (or m.GetClient(), which reads the same
//     cache), never to the API server: the kube-bind kinds through Get
//     and List, as *unstructured.Unstructured of the GroupVersionKinds
//     in kinds.go (the cache holds them compactly), Namespaces, Roles,
//     RoleBindings and Leases typed. A kind
//     missing from Kinds is refused by the cache (it would otherwise
//     start a cluster-wide informer of its own): add it there with the
//     union of what its readers need, and a label selector where only
//     the backend's objects matter.
//   - writes go through m.Kube, m.Dynamic or m.GetClient(), which share
//     the budget and the connections.
//   - m.AddController adds a reconciler fed by watches of that cache;
//     m.AddRunnable adds anything else that must run only on the leader.
//
// The cache runs on every replica, so a new leader starts with it warm;
// the controllers start on the leader only.
package kbmanager

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kbprovider/backend/internal/binding"
)

// IndexConsumerNamespace indexes the cached namespaces made for
// APIServiceNamespaces by the consumer namespace they belong to
// (client.MatchingFields{IndexConsumerNamespace: consumer}).
const IndexConsumerNamespace = "consumer-namespace"

// ConsumerNamespaceOf is the index IndexConsumerNamespace.
func ConsumerNamespaceOf(o client.Object) []string {
	if owner := o.GetLabels()[binding.LabelConsumerNamespace]; owner != "" {
		return []string{owner}
	}
	return nil
}

// The one request budget of all provider-side controllers together: a
// settled consumer costs none, so it is spent on new and changed ones
// and on a new leader's few lists.
const (
	QPS   = 200
	Burst = 400
)

// Budgeted returns a copy of rc whose clients, and the clients of every
// copy of it, share one token bucket of QPS and Burst.
func Budgeted(rc *rest.Config) *rest.Config {
	c := rest.CopyConfig(rc)
	c.QPS, c.Burst = QPS, Burst
	c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(QPS, Burst)
	return c
}

// Options configure Run.
type Options struct {
	Leader LeaderOptions
	Logger *slog.Logger
	// Lease timings; 0 means client-go's usual 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Reconciled, if set, is told of every reconcile that returned (for
	// tests: what a reconcile cost, which came first).
	Reconciled func(controller string, req reconcile.Request, err error)
}

// Manager is one leadership term's manager, with typed and dynamic
// clients on the same budget and connections as its client.
type Manager struct {
	manager.Manager
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	Log     *slog.Logger

	reconciled func(controller string, req reconcile.Request, err error)
	mu         sync.Mutex
	stopped    bool
	running    sync.WaitGroup
}

// Setup adds controllers to a term's manager.
type Setup func(*Manager) error

// usePriorityQueue: controller-runtime's priority queue hands out new
// and changed objects before those of a term's initial list (AddLow and
// controller-runtime's handlers mark the latter low), so a consumer's new
// request is answered while a new leader still works through every
// consumer. It needs controller-runtime v0.25.3 or later: before, a
// worker could wait forever on a queue shut down under it, and a term
// never ended.
const usePriorityQueue = true

// restartAfter is the pause before a term that failed starts again.
const restartAfter = 5 * time.Second

// Run runs the setups' controllers until ctx ends: on the replica holding
// the Lease when o.Leader.Enabled, else right here. A term ends when
// leadership is lost or the manager cannot start (e.g. the kube-bind CRDs
// are not installed yet); then Run starts a new one after a pause. Run
// returns when ctx ended, every controller returned and the Lease was
// released, so that another replica takes over at once.
func Run(ctx context.Context, rc *rest.Config, o Options, setups ...Setup) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	setLoggerOnce.Do(func() { ctrllog.SetLogger(logr.FromSlogHandler(o.Logger.Handler())) })
	for ctx.Err() == nil {
		err := runTerm(ctx, rc, o, setups)
		if ctx.Err() != nil {
			break
		}
		// A lost Lease, or a cluster without the kube-bind CRDs yet.
		o.Logger.Warn("provider-side controllers stopped; starting again in 5s", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(restartAfter):
		}
	}
}

// runTerm builds a manager with the setups' controllers and runs it until
// ctx ends or leadership is lost.
func runTerm(ctx context.Context, rc *rest.Config, o Options, setups []Setup) error {
	m, err := newManager(rc, o)
	if err != nil {
		return err
	}
	for _, setup := range setups {
		if err := setup(m); err != nil {
			return err
		}
	}
	return m.start(ctx)
}

var setLoggerOnce sync.Once

func newManager(rc *rest.Config, o Options) (*Manager, error) {
	log := o.Logger
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	for _, k := range cachedKinds {
		k.register(scheme)
	}
	opts := manager.Options{
		Scheme: scheme,
		Logger: logr.FromSlogHandler(log.Handler()),
		Cache: cache.Options{
			ByObject: byObject(),
			// Event-driven: a controller that must look again later says
			// when (RequeueAfter).
			SyncPeriod:                  new(time.Duration(0)),
			ReaderFailOnMissingInformer: true,
		},
		Client:  client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{
			// Every term has a new manager with the same controllers.
			SkipNameValidation: new(true),
			UsePriorityQueue:   new(usePriorityQueue),
		},
		// Wait for every controller, however long its last request takes.
		GracefulShutdownTimeout: new(time.Duration(-1)),
	}
	if o.Leader.Enabled {
		lock, id, err := newLock(rc, o.Leader)
		if err != nil {
			return nil, err
		}
		log = log.With("lease", o.Leader.Namespace+"/"+o.Leader.LeaseName, "identity", id)
		opts.Logger = logr.FromSlogHandler(log.Handler())
		opts.LeaderElection = true
		opts.LeaderElectionID = o.Leader.LeaseName
		opts.LeaderElectionNamespace = o.Leader.Namespace
		opts.LeaderElectionResourceLockInterface = lock
		opts.LeaderElectionReleaseOnCancel = true
		lease, renew, retry := 15*time.Second, 10*time.Second, 2*time.Second
		if o.LeaseDuration > 0 {
			lease, renew, retry = o.LeaseDuration, o.RenewDeadline, o.RetryPeriod
		}
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &lease, &renew, &retry
	}
	mgr, err := manager.New(rc, opts)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfigAndClient(rc, mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfigAndClient(rc, mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	m := &Manager{Manager: mgr, Kube: kube, Dynamic: dyn, Log: log, reconciled: o.Reconciled}
	err = mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Namespace{}, IndexConsumerNamespace, ConsumerNamespaceOf)
	if err != nil {
		return nil, err
	}
	if o.Leader.Enabled {
		// The leader's runnables start when the Lease is won.
		if err := m.AddRunnable(func(context.Context) error { log.Info("leader election: became leader"); return nil }); err != nil {
			return nil, err
		}
	}
	// Every kind is cached on every replica from the start, whether or
	// not a controller watches it yet: a new leader finds them warm.
	for obj := range byObject() {
		if _, err := mgr.GetCache().GetInformer(context.Background(), obj); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// newLock is the Lease, held under this replica's pod name and a random
// suffix (a restarted pod is a new holder), renewed by a client of its
// own: a busy budget must not cost the leadership.
func newLock(rc *rest.Config, o LeaderOptions) (resourcelock.Interface, string, error) {
	lc := rest.CopyConfig(rc)
	lc.RateLimiter, lc.QPS, lc.Burst = nil, 5, 10
	kube, err := kubernetes.NewForConfig(lc)
	if err != nil {
		return nil, "", err
	}
	id := o.PodName
	if id == "" {
		id, _ = os.Hostname()
	}
	id += "_" + strings.ToLower(rand.Text()[:8])
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.Namespace, o.LeaseName, nil, kube.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id})
	return lock, id, err
}

// start runs the manager until ctx ends or leadership is lost, then waits
// for every controller.
func (m *Manager) start(ctx context.Context) error {
	err := m.Start(ctx)
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.running.Wait()
	return err
}

// AddRunnable runs run on the leader, for the term; the term waits for
// it to return. An error ends the term (the manager stops and Run starts
// a new one).
func (m *Manager) AddRunnable(run func(context.Context) error) error {
	return m.Add(manager.RunnableFunc(func(ctx context.Context) error {
		m.mu.Lock()
		if m.stopped {
			m.mu.Unlock()
			return nil
		}
		m.running.Add(1)
		m.mu.Unlock()
		defer m.running.Done()
		return run(ctx)
	}))
}

// Reconcile handles one request. A positive duration asks for another
// look that much later without counting as a failure; an error is logged
// at WARN and retried with back-off.
type Reconcile func(ctx context.Context, req reconcile.Request) (again time.Duration, err error)

// AddController adds the reconcile rec, named name, with workers workers,
// fed by sources (watches of m.GetCache(), see Watch).
func (m *Manager) AddController(name string, workers int, rec Reconcile, sources ...source.Source) error {
	c, err := controller.NewUnmanaged(name, controller.Options{
		Reconciler: &retrying{name: name, rec: rec, log: m.Log, reconciled: m.reconciled,
			backoff: workqueue.DefaultTypedItemBasedRateLimiter[reconcile.Request]()},
		MaxConcurrentReconciles: max(workers, 1),
		SkipNameValidation:      new(true),
		UsePriorityQueue:        new(usePriorityQueue),
		Logger:                  m.GetLogger().WithValues("controller", name),
	})
	if err != nil {
		return err
	}
	for _, s := range sources {
		if err := c.Watch(s); err != nil {
			return err
		}
	}
	return m.AddRunnable(c.Start)
}

// retrying runs a Reconcile for controller-runtime: it retries a failure
// itself, so that a transient error is a WARN and not controller-runtime's
// ERROR, with the back-off of client-go's controllers.
type retrying struct {
	name       string
	rec        Reconcile
	log        *slog.Logger
	reconciled func(controller string, req reconcile.Request, err error)
	backoff    workqueue.TypedRateLimiter[reconcile.Request]
}

func (r *retrying) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	again, err := r.rec(ctx, req)
	if r.reconciled != nil {
		r.reconciled(r.name, req, err)
	}
	if err == nil {
		r.backoff.Forget(req)
		return reconcile.Result{RequeueAfter: again}, nil
	}
	if ctx.Err() != nil {
		return reconcile.Result{}, nil // shutdown cancels work in flight
	}
	r.log.Warn(r.name+": reconcile failed, retrying", "key", req.String(), "error", err, "retries", r.backoff.NumRequeues(req))
	return reconcile.Result{RequeueAfter: r.backoff.When(req)}, nil
}

// AddLow queues reqs behind every new or changed object: work for
// everybody (an exported CRD changed) waits behind a new request.
func AddLow(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs ...reconcile.Request) {
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: new(handler.LowPriority)}, reqs...)
		return
	}
	for _, req := range reqs {
		q.Add(req)
	}
}
