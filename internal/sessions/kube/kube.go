// Package kube is a sessions.Store kept in the provider cluster: outcomes,
// deliveries and single-use marks are Secrets in the backend's namespace,
// written create-if-absent (so exactly one replica wins each). Every
// create passes the store's write budget (sessions.Limits.WriteRate), so
// a flood of writes is refused at once instead of filling etcd. Poll
// admission stays in memory on the replica that owns the session, as
// sessions.Store documents.
//
// A replica keeps of each outcome and delivery only what a poll decides on
// (state, a short deny reason, the provider namespace a response was
// issued for, the delivery time, the collection time), in
// annotations read by a metadata-only informer: the API server never sends
// it the records' data. A completed outcome's response is read with one
// GET when a poll is about to hand it out (sessions.Peeker; the ring reads
// it through the owner's cache). Marks are not watched at all: their
// create answers. Records carry their collection minute in a label, and
// expired ones are deleted with one DeleteCollection a minute.
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kbprovider/backend/internal/kubeerr"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/admission"
)

// Labels and annotations of the record Secrets.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "kube-bind-backend"
	RecordLabel    = "kube-bind.io/session-record" // value: the record's kind
	// CollectMinuteLabel is the Unix minute (a decimal integer) from which
	// the record may be deleted: its collection time, rounded up to the
	// next minute. Label selectors compare integers (<), so one request
	// deletes every expired record.
	CollectMinuteLabel  = "kube-bind.io/collect-minute"
	CollectAnnotation   = "kube-bind.io/collect-after" // RFC 3339: expires + Limits.Grace
	StateAnnotation     = "kube-bind.io/state"         // an outcome's: completed or denied
	ReasonAnnotation    = "kube-bind.io/deny-reason"   // a denial's reason, when short
	DeliveredAnnotation = "kube-bind.io/delivered-at"  // RFC 3339: the first delivery
	// NamespaceAnnotation is a completed outcome's provider namespace
	// (sessions.Outcome.Namespace), also in the data under "namespace".
	NamespaceAnnotation = "kube-bind.io/provider-namespace"
)

const (
	kindOutcome, kindDelivered, kindOnce = "outcome", "delivered", "once"
	// Keys of the records' data: the whole record, also for replicas
	// that read it from there. The response is the BindingResponse
	// alone, as versions that keep no namespace write and read it.
	keyState, keyResponse, keyNamespace, keyReason, keyAt = "state", "response", "namespace", "reason", "at"

	collectEvery = time.Minute
	// maxCollectRequests bounds the DeleteCollection requests of one
	// collection that each ran into the API server's request timeout.
	maxCollectRequests = 10
	// maxResponseBytes leaves room in a Secret (1 MiB) for the rest.
	maxResponseBytes = 900 << 10
	// maxKeptReason bounds a deny reason kept in an annotation (and so in
	// every replica's memory); a longer one is read with the response.
	maxKeptReason = 256
)

// watchedRecords selects the records a replica keeps in memory: marks are
// never read (their create answers), so they are not watched.
var watchedRecords = RecordLabel + " in (" + kindOutcome + "," + kindDelivered + ")"

var secretsResource = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// Options configure New.
type Options struct {
	// Config reaches the provider cluster. The store makes its clients
	// from a copy with a request budget of its own (requestBudget).
	Config    *rest.Config
	Namespace string
	Limits    sessions.Limits  // zero fields: sessions.DefaultLimits
	Logger    *slog.Logger     // nil: slog.Default()
	Now       func() time.Time // nil: time.Now
}

// Store is a sessions.Store on Secrets. Run must be running for it to
// answer; it is ready once WaitForSync returned.
type Store struct {
	secrets  corev1client.SecretInterface
	meta     metadata.ResourceInterface
	ns       string
	limits   sessions.Limits
	log      *slog.Logger
	now      func() time.Time
	admit    *admission.Table
	budget   *sessions.WriteBudget
	informer cache.SharedIndexInformer

	mu      sync.Mutex
	waiters map[string][]chan struct{} // by Secret name

	// A broken watch (the API server restarted or is unreachable) makes
	// client-go relist with a backoff of up to 30 s (twice that with its
	// jitter), and a restarted API server may hold new watches back until
	// its watch cache is ready although lists already succeed: meanwhile
	// the cache misses what other replicas write. For brokenWatchWindow
	// after the last watch error, a record the cache does not hold is read
	// from the API server, at a bounded rate.
	brokenAt    atomic.Int64 // Unix nanoseconds of the last watch error; 0: none
	directReads *rate.Limiter
}

// Bounds of the reads that stand in for a broken watch.
const (
	directReadRate    = 20 // per second, per replica
	directReadTimeout = 2 * time.Second
	brokenWatchWindow = time.Minute
)

// requestBudget is the rate and burst of the store's own client, apart
// from the controllers'. It is above all the store may send: the creates
// the write budget admits, as many GETs again (a delivery's response, a
// lost create), the reads standing in for a broken watch, and collection;
// so it is the write budget, which refuses at once, that bounds writes,
// never client-go's limiter, which would queue them behind each other.
func requestBudget(l sessions.Limits) (float32, int) {
	return float32(2*l.WriteRate + directReadRate + 1), 2*l.WriteBurst + directReadRate + 1
}

var _ sessions.Peeker = (*Store)(nil)

// New returns a store; it reads nothing until Run.
func New(opts Options) (*Store, error) {
	if opts.Config == nil || opts.Namespace == "" {
		return nil, errors.New("sessions/kube: Config and Namespace are required")
	}
	limits := opts.Limits.WithDefaults()
	if limits.MaxResponseBytes > maxResponseBytes {
		return nil, fmt.Errorf("sessions/kube: MaxResponseBytes %d exceeds what a Secret holds (%d)", limits.MaxResponseBytes, maxResponseBytes)
	}
	cfg := rest.CopyConfig(opts.Config)
	cfg.QPS, cfg.Burst = requestBudget(limits)
	cfg.RateLimiter = nil
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("sessions/kube: %w", err)
	}
	metaClient, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("sessions/kube: %w", err)
	}
	s := &Store{
		secrets: client.CoreV1().Secrets(opts.Namespace), meta: metaClient.Resource(secretsResource).Namespace(opts.Namespace),
		ns: opts.Namespace, limits: limits, log: opts.Logger, now: opts.Now, admit: admission.New(limits),
		waiters:     map[string][]chan struct{}{},
		directReads: rate.NewLimiter(directReadRate, directReadRate),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.budget = sessions.NewWriteBudget(limits, s.now)
	// The informer's own list and watch calls tell when the watch is
	// broken: client-go retries a refused watch quietly, without its
	// watch error handler.
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = watchedRecords
			l, err := s.meta.List(ctx, o)
			s.noteWatchError(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = watchedRecords
			w, err := s.meta.Watch(ctx, o)
			s.noteWatchError(err)
			return w, err
		},
	}
	s.informer = cache.NewSharedIndexInformerWithOptions(lw, &metav1.PartialObjectMetadata{}, cache.SharedIndexInformerOptions{})
	if err := s.informer.SetTransform(s.slim); err != nil {
		return nil, err
	}
	if err := s.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		s.noteWatchError(err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return nil, err
	}
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.wake,
		UpdateFunc: func(_, obj any) { s.wake(obj) },
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// slim keeps of a record's metadata what a poll decides on and the
// informer needs (name, UID, resource version); the namespace string is
// shared by all.
func (s *Store) slim(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	var kept map[string]string
	for _, k := range []string{StateAnnotation, ReasonAnnotation, NamespaceAnnotation, DeliveredAnnotation, CollectAnnotation} {
		if v, ok := m.Annotations[k]; ok {
			if kept == nil {
				kept = make(map[string]string, 2)
			}
			kept[k] = v
		}
	}
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: s.ns, UID: m.UID, ResourceVersion: m.ResourceVersion, Annotations: kept,
	}}, nil
}

// Run runs the informer and the collector until ctx ends, and returns once
// both stopped. Call it once. Collection starts at once: it needs no
// list.
func (s *Store) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.informer.RunWithContext(ctx) })
	wg.Go(func() {
		t := time.NewTicker(collectEvery)
		defer t.Stop()
		for {
			s.collect(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Wait()
}

// HasSynced says whether the informer has listed the records once.
func (s *Store) HasSynced() bool { return s.informer.HasSynced() }

// WaitForSync returns once the informer has synced, or fails when ctx ends.
func (s *Store) WaitForSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return fmt.Errorf("%w: sessions/kube: the informer of %s did not sync", sessions.ErrUnavailable, s.ns)
	}
	return nil
}

// Outcome implements sessions.Store: a completed outcome's response costs
// one GET.
func (s *Store) Outcome(ctx context.Context, id string) (sessions.Outcome, error) {
	o, rec, err := s.Peek(ctx, id)
	if err != nil || rec == "" {
		return o, err
	}
	return s.ReadOutcome(ctx, id, rec)
}

// Peek implements sessions.Peeker: from the informer's cache, with no
// request (but while the watch is broken, see readDirect). The record is
// the outcome's UID.
func (s *Store) Peek(ctx context.Context, id string) (sessions.Outcome, string, error) {
	if !s.HasSynced() {
		return sessions.Outcome{}, "", fmt.Errorf("%w: sessions/kube: not synced", sessions.ErrUnavailable)
	}
	name := recordName(kindOutcome, id)
	var m metav1.Object
	if c := s.fromCache(name); c != nil {
		m = c
	} else if s.watchBroken() {
		if sec := s.readDirect(ctx, name); sec != nil {
			m = sec
		}
	}
	if m == nil || !s.live(m.GetAnnotations()) {
		return sessions.Outcome{}, "", nil
	}
	uid := string(m.GetUID())
	switch m.GetAnnotations()[StateAnnotation] {
	case sessions.StateCompleted.String():
		return sessions.Outcome{State: sessions.StateCompleted, Namespace: m.GetAnnotations()[NamespaceAnnotation]}, uid, nil
	case sessions.StateDenied.String():
		if reason, ok := m.GetAnnotations()[ReasonAnnotation]; ok {
			return sessions.Outcome{State: sessions.StateDenied, DenyReason: reason}, "", nil
		}
		return sessions.Outcome{State: sessions.StateDenied}, uid, nil
	}
	// A record without the annotation (edited by hand): its data says.
	o, err := s.ReadOutcome(ctx, id, uid)
	return o, "", err
}

// ReadOutcome implements sessions.Peeker with one GET.
func (s *Store) ReadOutcome(ctx context.Context, id, rec string) (sessions.Outcome, error) {
	sec, err := s.secrets.Get(ctx, recordName(kindOutcome, id), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return sessions.Outcome{}, nil
	case err != nil:
		return sessions.Outcome{}, apiError("get", err)
	case string(sec.UID) != rec || !s.live(sec.Annotations):
		// Collected, or another record under the name.
		return sessions.Outcome{}, nil
	}
	switch string(sec.Data[keyState]) {
	case sessions.StateCompleted.String():
		// A record of a version that kept no namespace names none: the
		// caller then hands its response out to nobody (it cannot mark
		// the binding delivered), rather than guess the namespace.
		ns := string(sec.Data[keyNamespace])
		if ns == "" {
			ns = sec.Annotations[NamespaceAnnotation]
		}
		return sessions.Outcome{State: sessions.StateCompleted, Response: sec.Data[keyResponse], Namespace: ns}, nil
	case sessions.StateDenied.String():
		return sessions.Outcome{State: sessions.StateDenied, DenyReason: string(sec.Data[keyReason])}, nil
	}
	s.log.Warn("session record has no valid state; treated as pending", "secret", sec.Name)
	return sessions.Outcome{}, nil
}

// live says whether a record with annotations is before its collection
// time (or has none that can be read: such a record is never collected
// by time either).
func (s *Store) live(annotations map[string]string) bool {
	at, err := time.Parse(time.RFC3339Nano, annotations[CollectAnnotation])
	return err != nil || !s.now().After(at)
}

// Complete implements sessions.Store.
func (s *Store) Complete(ctx context.Context, id string, expires time.Time, ns string, response []byte) error {
	if len(response) > s.limits.MaxResponseBytes {
		return sessions.ErrTooLarge
	}
	data := map[string][]byte{keyState: []byte(sessions.StateCompleted.String()), keyResponse: response}
	kept := map[string]string{StateAnnotation: sessions.StateCompleted.String()}
	if ns != "" {
		data[keyNamespace] = []byte(ns)
		kept[NamespaceAnnotation] = ns
	}
	return s.create(ctx, s.record(kindOutcome, id, expires, kept, data), sessions.ErrNotPending)
}

// Deny implements sessions.Store.
func (s *Store) Deny(ctx context.Context, id string, expires time.Time, reason string) error {
	data := map[string][]byte{keyState: []byte(sessions.StateDenied.String()), keyReason: []byte(reason)}
	kept := map[string]string{StateAnnotation: sessions.StateDenied.String()}
	if len(reason) <= maxKeptReason {
		kept[ReasonAnnotation] = reason
	}
	return s.create(ctx, s.record(kindOutcome, id, expires, kept, data), sessions.ErrNotPending)
}

// Deliver implements sessions.Store: from the cache, or one create.
func (s *Store) Deliver(ctx context.Context, id string, expires time.Time) (time.Time, error) {
	o, _, err := s.Peek(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	if o.State != sessions.StateCompleted {
		return time.Time{}, sessions.ErrNotPending
	}
	name := recordName(kindDelivered, id)
	if m := s.fromCache(name); m != nil {
		if at, err := time.Parse(time.RFC3339Nano, m.GetAnnotations()[DeliveredAnnotation]); err == nil {
			return at, nil
		}
	} else {
		now := s.now()
		stamp := now.Format(time.RFC3339Nano)
		rec := s.record(kindDelivered, id, expires, map[string]string{DeliveredAnnotation: stamp}, map[string][]byte{keyAt: []byte(stamp)})
		switch err := s.create(ctx, rec, errTaken); {
		case err == nil:
			return now, nil
		case !errors.Is(err, errTaken):
			return time.Time{}, err
		}
	}
	// Another replica delivered first (or our cache lags), or the cached
	// record lacks the annotation: the record in the API server counts.
	sec, err := s.secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return time.Time{}, apiError("get", err)
	}
	at, err := time.Parse(time.RFC3339Nano, sec.Annotations[DeliveredAnnotation])
	if err != nil {
		at, err = time.Parse(time.RFC3339Nano, string(sec.Data[keyAt]))
	}
	if err != nil {
		s.log.Warn("session record has no valid delivery time", "secret", name)
		return time.Time{}, fmt.Errorf("sessions/kube: delivery record %s is malformed", name)
	}
	return at, nil
}

// UseOnce implements sessions.Store.
func (s *Store) UseOnce(ctx context.Context, key string, expires time.Time) error {
	return s.create(ctx, s.record(kindOnce, key, expires, nil, nil), sessions.ErrNonceUsed)
}

// AdmitPoll implements sessions.Store.
func (s *Store) AdmitPoll(_ context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	return s.admit.Admit(id, nonce, expires, s.now(), minInterval)
}

// Wait implements sessions.Store.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Outcome, error) {
	o, rec, err := s.WaitPeek(ctx, id)
	if err != nil || rec == "" {
		return o, err
	}
	return s.ReadOutcome(ctx, id, rec)
}

// WaitPeek implements sessions.Peeker.
func (s *Store) WaitPeek(ctx context.Context, id string) (sessions.Outcome, string, error) {
	name := recordName(kindOutcome, id)
	for {
		// Subscribe before reading, so an outcome arriving in between wakes us.
		ch := s.subscribe(name)
		o, rec, err := s.Peek(ctx, id)
		if err != nil || o.State != sessions.StatePending {
			s.unsubscribe(name, ch)
			return o, rec, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			s.unsubscribe(name, ch)
			return s.Peek(context.WithoutCancel(ctx), id)
		}
	}
}

func (s *Store) subscribe(name string) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[name] = append(s.waiters[name], ch)
	s.mu.Unlock()
	return ch
}

func (s *Store) unsubscribe(name string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := slices.DeleteFunc(s.waiters[name], func(w chan struct{}) bool { return w == ch })
	if len(ws) == 0 {
		delete(s.waiters, name)
	} else {
		s.waiters[name] = ws
	}
}

// wake is the informer's handler: a record appeared or changed.
func (s *Store) wake(obj any) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.waiters[m.GetName()] {
		close(ch)
	}
	delete(s.waiters, m.GetName())
}

// recordName is the Secret name of a record of kind for id (or key).
func recordName(kind, id string) string {
	sum := sha256.Sum256([]byte(id))
	return "kb-session-" + kind + "-" + hex.EncodeToString(sum[:])[:40]
}

// record returns the Secret of a record of kind for id, collected after
// expires plus the grace period; kept are the annotations a replica keeps
// in memory, data the whole record.
func (s *Store) record(kind, id string, expires time.Time, kept map[string]string, data map[string][]byte) *corev1.Secret {
	collect := expires.Add(s.limits.Grace)
	annotations := map[string]string{CollectAnnotation: collect.UTC().Format(time.RFC3339Nano)}
	for k, v := range kept {
		annotations[k] = v
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      recordName(kind, id),
			Namespace: s.ns,
			Labels: map[string]string{ManagedByLabel: ManagedByValue, RecordLabel: kind,
				CollectMinuteLabel: strconv.FormatInt(collectMinute(collect), 10)},
			Annotations: annotations,
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// collectMinute is the Unix minute from which a record collected after at
// may be deleted: the first one that begins after at.
func collectMinute(at time.Time) int64 { return at.Unix()/60 + 1 }

// fromCache returns the record name in the informer's cache, or nil.
func (s *Store) fromCache(name string) metav1.Object {
	obj, ok, err := s.informer.GetStore().GetByKey(s.ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	m, _ := obj.(metav1.Object)
	return m
}

// noteWatchError records a failed list or watch of the informer.
func (s *Store) noteWatchError(err error) {
	if err != nil {
		s.brokenAt.Store(time.Now().UnixNano())
	}
}

// watchBroken says whether the informer's watch failed less than
// brokenWatchWindow ago. A successful list alone does not end it: the
// watch after it may still be held back.
func (s *Store) watchBroken() bool {
	at := s.brokenAt.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < brokenWatchWindow
}

// readDirect reads the record name from the API server, within the rate
// of such reads; nil when it is not there, cannot be read, or the rate is
// spent (the next poll asks again).
func (s *Store) readDirect(ctx context.Context, name string) *corev1.Secret {
	if !s.directReads.Allow() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, directReadTimeout)
	defer cancel()
	sec, err := s.secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return sec
}

// errTaken tells Deliver that the record exists.
var errTaken = errors.New("record exists")

// create creates sec, or returns taken if a record of its name exists:
// whoever created that first won. Each create spends one write of the
// budget, whatever the API server answers; with none left it fails with
// sessions.ErrOverBudget and asks nothing.
func (s *Store) create(ctx context.Context, sec *corev1.Secret, taken error) error {
	if err := s.budget.Take(); err != nil {
		return err
	}
	_, err := s.secrets.Create(ctx, sec, metav1.CreateOptions{})
	switch {
	case err == nil:
		return nil
	case apierrors.IsAlreadyExists(err):
		return taken
	}
	return apiError("create", err)
}

// collect deletes the records past their collection minute with one
// request, whatever their number and whether the informer has listed,
// then the records without that label (edited by hand) past their
// collection time, and forgets the admission state of expired sessions.
// Every replica may run it: deletes are idempotent.
func (s *Store) collect(ctx context.Context) {
	now := s.now()
	s.admit.Sweep(now)
	expired := fmt.Sprintf("%s,%s<%d", RecordLabel, CollectMinuteLabel, now.Unix()/60+1)
	for range maxCollectRequests {
		err := s.secrets.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: expired})
		if err == nil || ctx.Err() != nil {
			break
		}
		// A backlog larger than the API server deletes within its
		// request timeout: what it deleted stays deleted, go on.
		if !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) {
			s.log.Warn("collecting session records failed; trying again in a minute", "error", err)
			break
		}
	}
	unlabelled, err := s.meta.List(ctx, metav1.ListOptions{LabelSelector: RecordLabel + ",!" + CollectMinuteLabel, ResourceVersion: "0"})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("listing session records without a collection minute failed", "error", err)
		}
		return
	}
	for _, m := range unlabelled.Items {
		at, err := time.Parse(time.RFC3339Nano, m.Annotations[CollectAnnotation])
		if err != nil {
			s.log.Warn("session record has no valid collection time; left alone", "secret", m.Name)
			continue
		}
		if !now.After(at) {
			continue
		}
		// The UID precondition spares a record created again under the name;
		// NotFound means another replica collected it first.
		uid := m.UID
		err = s.secrets.Delete(ctx, m.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			s.log.Warn("collecting a session record failed", "secret", m.Name, "error", err)
		}
	}
}

// apiError wraps err; transient failures also wrap sessions.ErrUnavailable.
func apiError(op string, err error) error {
	if kubeerr.Transient(err) {
		return fmt.Errorf("%w: sessions/kube: %s: %w", sessions.ErrUnavailable, op, err)
	}
	return fmt.Errorf("sessions/kube: %s: %w", op, err)
}
