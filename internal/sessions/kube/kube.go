// Package kube is a sessions.Store kept in the provider cluster: outcomes,
// deliveries and single-use marks are Secrets in the backend's namespace,
// written create-if-absent (so exactly one replica wins each) and read from
// one informer (so reads make no API call). Every create passes the
// store's write budget (sessions.Limits.WriteRate), so a flood of writes
// is refused at once instead of filling etcd. Poll admission stays in
// memory on the replica that owns the session, as sessions.Store
// documents.
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/admission"
)

// Labels and annotations of the record Secrets.
const (
	ManagedByLabel    = "app.kubernetes.io/managed-by"
	ManagedByValue    = "kube-bind-backend"
	RecordLabel       = "kube-bind.io/session-record" // value: the record's kind
	CollectAnnotation = "kube-bind.io/collect-after"  // RFC 3339: expires + Limits.Grace
)

const (
	kindOutcome, kindDelivered, kindOnce = "outcome", "delivered", "once"
	// Keys of the records' data.
	keyState, keyResponse, keyReason, keyAt = "state", "response", "reason", "at"

	collectEvery = time.Minute
	// maxResponseBytes leaves room in a Secret (1 MiB) for the rest.
	maxResponseBytes = 900 << 10
)

// Options configure New.
type Options struct {
	Client    kubernetes.Interface
	Namespace string
	Limits    sessions.Limits  // zero fields: sessions.DefaultLimits
	Logger    *slog.Logger     // nil: slog.Default()
	Now       func() time.Time // nil: time.Now
}

// Store is a sessions.Store on Secrets. Run must be running for it to
// answer; it is ready once WaitForSync returned.
type Store struct {
	secrets  corev1client.SecretInterface
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

var _ sessions.Store = (*Store)(nil)

// New returns a store; it reads nothing until Run.
func New(opts Options) (*Store, error) {
	if opts.Client == nil || opts.Namespace == "" {
		return nil, errors.New("sessions/kube: Client and Namespace are required")
	}
	limits := opts.Limits.WithDefaults()
	if limits.MaxResponseBytes > maxResponseBytes {
		return nil, fmt.Errorf("sessions/kube: MaxResponseBytes %d exceeds what a Secret holds (%d)", limits.MaxResponseBytes, maxResponseBytes)
	}
	s := &Store{
		secrets: opts.Client.CoreV1().Secrets(opts.Namespace), ns: opts.Namespace,
		limits: limits, log: opts.Logger, now: opts.Now, admit: admission.New(limits),
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
			o.LabelSelector = RecordLabel
			l, err := s.secrets.List(ctx, o)
			s.noteWatchError(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = RecordLabel
			w, err := s.secrets.Watch(ctx, o)
			s.noteWatchError(err)
			return w, err
		},
	}
	s.informer = cache.NewSharedIndexInformerWithOptions(lw, &corev1.Secret{}, cache.SharedIndexInformerOptions{})
	if err := s.informer.SetTransform(dropManagedFields); err != nil {
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

func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// Run runs the informer and the collector until ctx ends, and returns once
// both stopped. Call it once.
func (s *Store) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.informer.RunWithContext(ctx) })
	wg.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
			return
		}
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

// Outcome implements sessions.Store.
func (s *Store) Outcome(ctx context.Context, id string) (sessions.Outcome, error) {
	if !s.HasSynced() {
		return sessions.Outcome{}, fmt.Errorf("%w: sessions/kube: not synced", sessions.ErrUnavailable)
	}
	name := recordName(kindOutcome, id)
	sec := s.fromCache(name)
	if sec == nil && s.watchBroken() {
		sec = s.readDirect(ctx, name)
	}
	if sec == nil {
		return sessions.Outcome{}, nil
	}
	switch string(sec.Data[keyState]) {
	case sessions.StateCompleted.String():
		return sessions.Outcome{State: sessions.StateCompleted, Response: sec.Data[keyResponse]}, nil
	case sessions.StateDenied.String():
		return sessions.Outcome{State: sessions.StateDenied, DenyReason: string(sec.Data[keyReason])}, nil
	}
	s.log.Warn("session record has no valid state; treated as pending", "secret", sec.Name)
	return sessions.Outcome{}, nil
}

// Complete implements sessions.Store.
func (s *Store) Complete(ctx context.Context, id string, expires time.Time, response []byte) error {
	if len(response) > s.limits.MaxResponseBytes {
		return sessions.ErrTooLarge
	}
	data := map[string][]byte{keyState: []byte(sessions.StateCompleted.String()), keyResponse: response}
	return s.create(ctx, s.record(kindOutcome, id, expires, data), sessions.ErrNotPending)
}

// Deny implements sessions.Store.
func (s *Store) Deny(ctx context.Context, id string, expires time.Time, reason string) error {
	data := map[string][]byte{keyState: []byte(sessions.StateDenied.String()), keyReason: []byte(reason)}
	return s.create(ctx, s.record(kindOutcome, id, expires, data), sessions.ErrNotPending)
}

// Deliver implements sessions.Store.
func (s *Store) Deliver(ctx context.Context, id string, expires time.Time) (time.Time, error) {
	o, err := s.Outcome(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	if o.State != sessions.StateCompleted {
		return time.Time{}, sessions.ErrNotPending
	}
	name := recordName(kindDelivered, id)
	sec := s.fromCache(name)
	if sec == nil {
		now := s.now()
		data := map[string][]byte{keyAt: []byte(now.Format(time.RFC3339Nano))}
		switch err := s.create(ctx, s.record(kindDelivered, id, expires, data), errTaken); {
		case err == nil:
			return now, nil
		case err != errTaken:
			return time.Time{}, err
		}
		// Another replica delivered first (or our cache lags): its time counts.
		if sec, err = s.secrets.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return time.Time{}, apiError("get", err)
		}
	}
	at, err := time.Parse(time.RFC3339Nano, string(sec.Data[keyAt]))
	if err != nil {
		s.log.Warn("session record has no valid delivery time", "secret", name)
		return time.Time{}, fmt.Errorf("sessions/kube: delivery record %s is malformed", name)
	}
	return at, nil
}

// UseOnce implements sessions.Store.
func (s *Store) UseOnce(ctx context.Context, key string, expires time.Time) error {
	return s.create(ctx, s.record(kindOnce, key, expires, nil), sessions.ErrNonceUsed)
}

// AdmitPoll implements sessions.Store.
func (s *Store) AdmitPoll(_ context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	return s.admit.Admit(id, nonce, expires, s.now(), minInterval)
}

// Wait implements sessions.Store.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Outcome, error) {
	name := recordName(kindOutcome, id)
	for {
		// Subscribe before reading, so an outcome arriving in between wakes us.
		ch := s.subscribe(name)
		o, err := s.Outcome(ctx, id)
		if err != nil || o.State != sessions.StatePending {
			s.unsubscribe(name, ch)
			return o, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			s.unsubscribe(name, ch)
			return s.Outcome(ctx, id)
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

func (s *Store) record(kind, id string, expires time.Time, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        recordName(kind, id),
			Namespace:   s.ns,
			Labels:      map[string]string{ManagedByLabel: ManagedByValue, RecordLabel: kind},
			Annotations: map[string]string{CollectAnnotation: expires.Add(s.limits.Grace).UTC().Format(time.RFC3339Nano)},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// fromCache returns the record name in the informer's cache, or nil.
func (s *Store) fromCache(name string) *corev1.Secret {
	obj, ok, err := s.informer.GetStore().GetByKey(s.ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	sec, _ := obj.(*corev1.Secret)
	return sec
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

// collect deletes the records past their collection time and forgets the
// admission state of expired sessions. Every replica may run it.
func (s *Store) collect(ctx context.Context) {
	now := s.now()
	s.admit.Sweep(now)
	for _, obj := range s.informer.GetStore().List() {
		sec, ok := obj.(*corev1.Secret)
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, sec.Annotations[CollectAnnotation])
		if err != nil {
			s.log.Warn("session record has no valid collection time; left alone", "secret", sec.Name)
			continue
		}
		if !now.After(at) {
			continue
		}
		// The UID precondition spares a record created again under the name;
		// NotFound means another replica collected it first.
		uid := sec.UID
		err = s.secrets.Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			s.log.Warn("collecting a session record failed", "secret", sec.Name, "error", err)
		}
	}
}

// apiError wraps err; transient failures also wrap sessions.ErrUnavailable.
func apiError(op string, err error) error {
	if transient(err) {
		return fmt.Errorf("%w: sessions/kube: %s: %w", sessions.ErrUnavailable, op, err)
	}
	return fmt.Errorf("sessions/kube: %s: %w", op, err)
}

func transient(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == 429
	}
	var netErr net.Error // *url.Error from the transport is one too
	return errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		utilnet.IsProbableEOF(err) || utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err)
}
