package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/conformance"
	"github.com/kbprovider/backend/internal/testutil"
)

func TestConformance(t *testing.T) {
	e := newEnv(t) // stores of the subtests share it; the suite's IDs are unique
	conformance.Run(t, func(t *testing.T, limits sessions.Limits, clock *testutil.Clock) sessions.Store {
		return e.startStore(t, storeOpts{limits: limits, now: clock.Now})
	})
}

func TestNewValidates(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	for _, o := range []Options{
		{Namespace: "ns"},
		{Config: cfg},
		{Config: cfg, Namespace: "ns", Limits: sessions.Limits{MaxResponseBytes: 1 << 20}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// shows waits until s shows the outcome of id in state.
func shows(t *testing.T, s *Store, id string, state sessions.State) sessions.Outcome {
	t.Helper()
	var o sessions.Outcome
	testutil.AwaitWithin(t, 10*time.Second, 10*time.Millisecond, fmt.Sprintf("outcome of %s is %v", id, state), func() (bool, error) {
		var err error
		o, err = s.Outcome(context.Background(), id)
		return err == nil && o.State == state, err
	})
	return o
}

// cached waits until s's informer holds the record kind of id.
func cached(t *testing.T, s *Store, kind, id string) {
	t.Helper()
	testutil.Await(t, kind+" record of "+id+" in the cache", func() bool { return s.fromCache(recordName(kind, id)) != nil })
}

// TestReplicas runs two stores on one namespace, as two replicas do.
func TestReplicas(t *testing.T) {
	e := newEnv(t)
	clockA, clockB := testutil.ClockAt(conformance.Start), testutil.ClockAt(conformance.Start.Add(5*time.Second))
	a := e.startStore(t, storeOpts{now: clockA.Now})
	b := e.startStore(t, storeOpts{now: clockB.Now})
	ctx := context.Background()
	exp := conformance.Start.Add(10 * time.Minute)

	// A waiter on b is woken by an outcome written on a.
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan sessions.Outcome, 1)
	go func() { o, _ := b.Wait(waitCtx, "s1"); got <- o }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	resp := []byte(`{"kind":"BindingResponse","kubeconfig":"credential-s1"}`)
	must(t, a.Complete(ctx, "s1", exp, "kb-ns", resp))
	if o := <-got; o.State != sessions.StateCompleted || string(o.Response) != string(resp) {
		t.Fatalf("Wait on the other replica returned %+v", o)
	}
	t.Logf("the other replica's waiter woke after %v", time.Since(start))
	if o := shows(t, b, "s1", sessions.StateCompleted); string(o.Response) != string(resp) {
		t.Fatalf("Outcome on the other replica: %s", o.Response)
	}

	// The first delivery counts on both, whatever their clocks say.
	shows(t, a, "s1", sessions.StateCompleted)
	first, err := a.Deliver(ctx, "s1", exp)
	must(t, err)
	again, err := b.Deliver(ctx, "s1", exp)
	must(t, err)
	if !first.Equal(conformance.Start) || !again.Equal(first) {
		t.Fatalf("deliveries at %v and %v, want both %v", first, again, conformance.Start)
	}

	// The credential is in data only.
	sec, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, recordName(kindOutcome, "s1"), metav1.GetOptions{})
	must(t, err)
	if meta := fmt.Sprint(sec.Labels, sec.Annotations); strings.Contains(meta, "credential") || sec.Type != corev1.SecretTypeOpaque {
		t.Fatalf("record metadata %s, type %s", meta, sec.Type)
	}
	// The response key holds the BindingResponse alone, as versions that
	// keep no namespace read it; the namespace has a key of its own and
	// an annotation, for the metadata-only cache.
	if string(sec.Data[keyResponse]) != string(resp) || string(sec.Data[keyNamespace]) != "kb-ns" || sec.Annotations[NamespaceAnnotation] != "kb-ns" {
		t.Fatalf("record response %q, namespace %q, annotation %q", sec.Data[keyResponse], sec.Data[keyNamespace], sec.Annotations[NamespaceAnnotation])
	}

	// Racing writers on both replicas: exactly one wins each time.
	for i := range 5 {
		id := fmt.Sprint("race-", i)
		errs := race(func() error { return a.Complete(ctx, id, exp, "kb-ns", []byte(`{"a":1}`)) },
			func() error { return b.Deny(ctx, id, exp, "no") })
		wantOneWinner(t, "Complete/Deny", errs, sessions.ErrNotPending)
		errs = race(func() error { return a.UseOnce(ctx, id, exp) }, func() error { return b.UseOnce(ctx, id, exp) })
		wantOneWinner(t, "UseOnce", errs, sessions.ErrNonceUsed)
	}
}

func race(fns ...func() error) []error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for i, fn := range fns {
		wg.Go(func() { <-startGate; errs[i] = fn() })
	}
	close(startGate)
	wg.Wait()
	return errs
}

func wantOneWinner(t *testing.T, what string, errs []error, loser error) {
	t.Helper()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, loser):
			t.Fatalf("%s: %v", what, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%s: %d winners (%v), want 1", what, wins, errs)
	}
}

// TestReadsMakeNoAPICalls: what a poll decides on (pending, denied, a
// repeated delivery) comes from the informer; a completed outcome's
// response costs one GET; a too large response is refused before any
// request.
func TestReadsMakeNoAPICalls(t *testing.T) {
	e := newEnv(t)
	var n atomic.Int64
	cfg := rest.CopyConfig(e.user)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return counting{rt, &n} }
	s := e.startStore(t, storeOpts{cfg: cfg})
	ctx := context.Background()
	exp := time.Now().Add(10 * time.Minute)
	must(t, s.Complete(ctx, "s1", exp, "kb-ns", []byte(`{}`)))
	must(t, s.Deny(ctx, "s2", exp, "not on the list"))
	shows(t, s, "s1", sessions.StateCompleted)
	shows(t, s, "s2", sessions.StateDenied)
	first, err := s.Deliver(ctx, "s1", exp)
	must(t, err)
	cached(t, s, kindDelivered, "s1")

	before := n.Load()
	for range 20 {
		if o, rec, err := s.Peek(ctx, "s1"); err != nil || o.State != sessions.StateCompleted || rec == "" || o.Response != nil {
			t.Fatalf("Peek: %+v, %q, %v", o, rec, err)
		}
		if o, err := s.Outcome(ctx, "s2"); err != nil || o.State != sessions.StateDenied || o.DenyReason != "not on the list" {
			t.Fatalf("Outcome of a denied session: %+v, %v", o, err)
		}
		if o, err := s.Outcome(ctx, "unknown"); err != nil || o.State != sessions.StatePending {
			t.Fatalf("Outcome of an unknown session: %v, %v", o.State, err)
		}
		if at, err := s.Deliver(ctx, "s1", exp); err != nil || !at.Equal(first) {
			t.Fatalf("Deliver again: %v, %v; want %v", at, err, first)
		}
		if _, err := s.Deliver(ctx, "unknown", exp); !errors.Is(err, sessions.ErrNotPending) {
			t.Fatalf("Deliver of a pending session: %v", err)
		}
		if o, _, err := s.WaitPeek(ctx, "s1"); err != nil || o.State != sessions.StateCompleted {
			t.Fatalf("WaitPeek: %v, %v", o.State, err)
		}
	}
	big := make([]byte, sessions.DefaultLimits.MaxResponseBytes+1)
	if err := s.Complete(ctx, "s3", exp, "kb-ns", big); !errors.Is(err, sessions.ErrTooLarge) {
		t.Fatalf("Complete of a large response: %v", err)
	}
	if after := n.Load(); after != before {
		t.Fatalf("reads made %d API requests, want none", after-before)
	}
	for range 3 {
		if o, err := s.Outcome(ctx, "s1"); err != nil || string(o.Response) != `{}` {
			t.Fatalf("Outcome: %+v, %v", o, err)
		}
	}
	if got := n.Load() - before; got != 3 {
		t.Fatalf("3 reads of a response made %d API requests, want 3", got)
	}
}

// TestSlimCache: a replica's cache holds the metadata a poll decides on,
// never a record's data, and no marks.
func TestSlimCache(t *testing.T) {
	e := newEnv(t)
	s := e.startStore(t, storeOpts{})
	ctx := context.Background()
	exp := time.Now().Add(10 * time.Minute)
	must(t, s.Complete(ctx, "s1", exp, "kb-ns", []byte(`{"kubeconfig":"credential-s1"}`)))
	must(t, s.Deny(ctx, "s2", exp, strings.Repeat("long reason ", 30)))
	must(t, s.UseOnce(ctx, "mark", exp))
	shows(t, s, "s1", sessions.StateCompleted)
	_, err := s.Deliver(ctx, "s1", exp)
	must(t, err)
	cached(t, s, kindDelivered, "s1")
	cached(t, s, kindOutcome, "s2")
	if o := shows(t, s, "s2", sessions.StateDenied); o.DenyReason != strings.Repeat("long reason ", 30) {
		t.Fatalf("a long deny reason read back as %q", o.DenyReason)
	}
	objs := s.informer.GetStore().List()
	if len(objs) != 3 {
		t.Fatalf("the cache holds %d records, want the 2 outcomes and the delivery (no marks)", len(objs))
	}
	for _, obj := range objs {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			t.Fatalf("the cache holds a %T", obj)
		}
		if dump := fmt.Sprintf("%+v", m); strings.Contains(dump, "credential") || strings.Contains(dump, "long reason") ||
			len(m.Labels) != 0 || len(m.ManagedFields) != 0 || len(m.Annotations) > 3 {
			t.Fatalf("a cached record holds more than it needs: %s", dump)
		}
	}
	if m := s.fromCache(recordName(kindOutcome, "s1")); m == nil || m.GetAnnotations()[NamespaceAnnotation] != "kb-ns" {
		t.Fatalf("the cached outcome lacks its namespace: %+v", m)
	}
}

// TestRecordWithoutNamespace: a completed record as a version that kept
// no namespace writes it (its response alone) reads back as that
// response naming no namespace, from the cache and from the data, so
// that its delivery is refused (lifecycle) rather than guessed.
func TestRecordWithoutNamespace(t *testing.T) {
	e := newEnv(t)
	s := e.startStore(t, storeOpts{})
	ctx := context.Background()
	exp := time.Now().Add(10 * time.Minute)
	resp := []byte(`{"kind":"BindingResponse","kubeconfig":"credential-old"}`)
	must(t, create(ctx, e.admin.CoreV1().Secrets(e.ns), s.record(kindOutcome, "old", exp,
		map[string]string{StateAnnotation: sessions.StateCompleted.String()},
		map[string][]byte{keyState: []byte(sessions.StateCompleted.String()), keyResponse: resp})))
	cached(t, s, kindOutcome, "old")
	peeked, rec, err := s.Peek(ctx, "old")
	must(t, err)
	if peeked.State != sessions.StateCompleted || peeked.Namespace != "" || rec == "" {
		t.Fatalf("Peek of a record without a namespace: %+v, %q", peeked, rec)
	}
	o, err := s.ReadOutcome(ctx, "old", rec)
	must(t, err)
	if string(o.Response) != string(resp) || o.Namespace != "" {
		t.Fatalf("ReadOutcome of a record without a namespace: response %q, namespace %q", o.Response, o.Namespace)
	}
}

// TestAPIServerAway cuts this replica off the API server (behind a proxy:
// the test control plane cannot restart its API server on the same data)
// while another replica keeps writing.
func TestAPIServerAway(t *testing.T) {
	e := newEnv(t)
	p := startProxy(t, strings.TrimPrefix(e.user.Host, "https://"))
	cfg := rest.CopyConfig(e.user)
	cfg.Host = "https://" + p.addr()
	a := e.startStore(t, storeOpts{cfg: cfg})
	b := e.startStore(t, storeOpts{})
	ctx := context.Background()
	exp := time.Now().Add(10 * time.Minute)
	must(t, a.Complete(ctx, "before", exp, "kb-ns", []byte(`{"n":1}`)))
	must(t, a.UseOnce(ctx, "mark-before", exp))
	shows(t, a, "before", sessions.StateCompleted)
	waiter := make(chan sessions.Outcome, 1)
	go func() { o, _ := a.Wait(ctx, "during"); waiter <- o }()

	p.cut()
	if o, _, err := a.Peek(ctx, "before"); err != nil || o.State != sessions.StateCompleted {
		t.Fatalf("Peek while away: %v, %v", o.State, err)
	}
	readCtx, cancelRead := context.WithTimeout(ctx, 5*time.Second)
	defer cancelRead()
	if _, err := a.Outcome(readCtx, "before"); !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("reading a response while away: %v, want ErrUnavailable", err)
	}
	writeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.UseOnce(writeCtx, "mark-during", exp); !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("UseOnce while away: %v, want ErrUnavailable", err)
	}
	if err := a.Complete(writeCtx, "refused", exp, "kb-ns", []byte(`{}`)); !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("Complete while away: %v, want ErrUnavailable", err)
	}
	must(t, b.Complete(ctx, "during", exp, "kb-ns", []byte(`{"n":2}`)))
	time.Sleep(time.Second)
	p.restore()

	start := time.Now()
	select {
	case o := <-waiter:
		if o.State != sessions.StateCompleted {
			t.Fatalf("Wait across the outage returned %v", o.State)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a waiter was not woken by an outcome written while its replica was away")
	}
	t.Logf("the informer caught up %v after the API server came back", time.Since(start))
	shows(t, a, "before", sessions.StateCompleted)
	must(t, a.UseOnce(ctx, "mark-during", exp))
	must(t, a.Complete(ctx, "refused", exp, "kb-ns", []byte(`{}`)))
	if err := a.UseOnce(ctx, "mark-before", exp); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("UseOnce of a mark spent before the outage: %v", err)
	}
}

// TestCollect drives the clock past expiry plus grace: collection
// deletes exactly the records past their collection minute, with one
// request, and nothing else.
func TestCollect(t *testing.T) {
	e := newEnv(t)
	clock := testutil.ClockAt(conformance.Start)
	var logs procs.Buffer
	var n atomic.Int64
	cfg := rest.CopyConfig(e.user)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return counting{rt, &n} }
	s := e.startStore(t, storeOpts{cfg: cfg, now: clock.Now, log: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	exp := conformance.Start.Add(10 * time.Minute)
	must(t, s.Complete(ctx, "s1", exp, "kb-ns", []byte(`{}`)))
	must(t, s.UseOnce(ctx, "mark", exp))
	must(t, s.UseOnce(ctx, "later", exp.Add(time.Hour)))
	must(t, s.Deny(ctx, "live", exp.Add(2*time.Minute), "no"))
	must(t, s.AdmitPoll(ctx, "s1", "n1", exp, 0))
	shows(t, s, "s1", sessions.StateCompleted)
	_, err := s.Deliver(ctx, "s1", exp)
	must(t, err)
	cached(t, s, kindDelivered, "s1")
	// Secrets that are not records, with and without a like label.
	for name, labels := range map[string]map[string]string{
		"unrelated":      nil,
		"unrelated-past": {CollectMinuteLabel: "1"},
	} {
		must(t, create(ctx, e.admin.CoreV1().Secrets(e.ns), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}))
	}
	records := func() []string {
		list, err := e.admin.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{})
		must(t, err)
		var names []string
		for _, sec := range list.Items {
			names = append(names, sec.Name)
		}
		slices.Sort(names)
		return names
	}
	all := records()
	if len(all) != 7 {
		t.Fatalf("secrets before collection: %v", all)
	}

	clock.Advance(10*time.Minute + sessions.DefaultLimits.Grace) // expiry plus grace: kept
	s.collect(ctx)
	if got := records(); !slices.Equal(got, all) {
		t.Fatalf("secrets at expiry plus grace: %v, want all %v", got, all)
	}
	if o, _ := s.Outcome(ctx, "s1"); o.State != sessions.StateCompleted {
		t.Fatalf("Outcome at its collection time: %v", o.State)
	}
	clock.Advance(time.Second) // past it: not served, though not deleted yet
	if o, rec, _ := s.Peek(ctx, "s1"); o.State != sessions.StatePending || rec != "" {
		t.Fatalf("Peek past the collection time: %+v, %q", o, rec)
	}
	clock.Advance(time.Minute) // past its collection minute
	before := n.Load()
	s.collect(ctx)
	if got := n.Load() - before; got != 2 {
		t.Fatalf("collection made %d requests, want 2 (the delete and the list of unlabelled records)", got)
	}
	s.collect(ctx) // again, with nothing to collect: idempotent
	want := []string{recordName(kindOutcome, "live"), recordName(kindOnce, "later"), "unrelated", "unrelated-past"}
	slices.Sort(want)
	if got := records(); !slices.Equal(got, want) {
		t.Fatalf("secrets after collection: %v, want %v", got, want)
	}
	if sessions, nonces := s.admit.Len(); sessions != 0 || nonces != 0 {
		t.Fatalf("admission table holds %d sessions, %d nonces after their expiry", sessions, nonces)
	}
	if strings.Contains(logs.String(), "WARN") {
		t.Fatalf("collection logged warnings:\n%s", logs.String())
	}
}

// TestCollectOnStart: a replica collects before its informer has listed
// (here: it cannot list at all).
func TestCollectOnStart(t *testing.T) {
	e := newEnv(t)
	clock := testutil.ClockAt(conformance.Start)
	s := e.startStore(t, storeOpts{now: clock.Now})
	ctx := context.Background()
	exp := conformance.Start.Add(10 * time.Minute)
	must(t, s.UseOnce(ctx, "mark", exp))
	must(t, s.Complete(ctx, "s1", exp, "kb-ns", []byte(`{}`)))

	// A user who may delete records but not list or watch them.
	must(t, create(ctx, e.admin.RbacV1().Roles(e.ns), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "collect-only"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"deletecollection"}}}}))
	must(t, create(ctx, e.admin.RbacV1().RoleBindings(e.ns), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "collect-only"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "collect-only"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "collect-only"}},
	}))
	clock.Advance(time.Hour)
	late, err := New(Options{Config: controlplane.ConfigForUser(t, e.cp, "collect-only"), Namespace: e.ns, Now: clock.Now,
		Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { late.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	testutil.Await(t, "the new replica collects at start", func() bool {
		list, err := e.admin.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{LabelSelector: RecordLabel})
		return err == nil && len(list.Items) == 0
	})
	if late.HasSynced() {
		t.Fatal("a replica that may not list synced")
	}
}

// TestGarbageRecords: Secrets with the label but edited by hand read as
// absent, are logged, and never panic.
func TestGarbageRecords(t *testing.T) {
	e := newEnv(t)
	var logs procs.Buffer
	s := e.startStore(t, storeOpts{log: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	exp := time.Now().Add(10 * time.Minute)
	must(t, s.Complete(ctx, "s2", exp, "kb-ns", []byte(`{}`)))
	shows(t, s, "s2", sessions.StateCompleted)
	junk := func(name, kind string, data map[string][]byte, annotations map[string]string) {
		must(t, create(ctx, e.admin.CoreV1().Secrets(e.ns), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{RecordLabel: kind}, Annotations: annotations},
			Data:       data,
		}))
	}
	junk(recordName(kindOutcome, "s1"), kindOutcome, map[string][]byte{keyState: {0xff, 'x'}, keyResponse: []byte("credential-xyz")}, nil)
	junk(recordName(kindOutcome, "s3"), "", nil, map[string]string{CollectAnnotation: "yesterday"})
	junk(recordName(kindDelivered, "s2"), kindDelivered, map[string][]byte{keyAt: []byte("soon")}, map[string]string{CollectAnnotation: "2000-01-01T00:00:00Z"})
	junk("kb-session-whatever", "whatever", map[string][]byte{"x": nil}, nil)
	testutil.Await(t, "the junk is in the cache", func() bool { return len(s.informer.GetStore().List()) == 3 })

	for _, id := range []string{"s1", "s3"} {
		if o, err := s.Outcome(ctx, id); err != nil || o.State != sessions.StatePending || o.Response != nil {
			t.Fatalf("Outcome of a garbage record: %+v, %v", o, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		o, err := s.Wait(wctx, id)
		cancel()
		if err != nil || o.State != sessions.StatePending {
			t.Fatalf("Wait on a garbage record: %v, %v", o.State, err)
		}
	}
	if _, err := s.Deliver(ctx, "s2", exp); err == nil {
		t.Fatal("Deliver accepted a garbage delivery record")
	}
	s.collect(ctx)
	list, err := e.admin.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{LabelSelector: RecordLabel})
	must(t, err)
	if n := len(list.Items); n < 4 {
		t.Fatalf("collection removed garbage it cannot read (%d records left)", n)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || strings.Contains(out, "credential-xyz") {
		t.Fatalf("logs:\n%s", out)
	}
}

func TestTransientErrors(t *testing.T) {
	gr := schema.GroupResource{Resource: "secrets"}
	for _, c := range []struct {
		err       error
		transient bool
	}{
		{apierrors.NewServiceUnavailable("x"), true},
		{apierrors.NewInternalError(errors.New("x")), true},
		{apierrors.NewTooManyRequests("x", 1), true},
		{apierrors.NewTimeoutError("x", 1), true},
		{apierrors.NewServerTimeout(gr, "create", 1), true},
		{context.DeadlineExceeded, true},
		{&url.Error{Op: "Post", URL: "https://x", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, true},
		{&url.Error{Op: "Post", URL: "https://x", Err: io.EOF}, true},
		{apierrors.NewForbidden(gr, "x", errors.New("x")), false},
		{apierrors.NewBadRequest("x"), false},
		{context.Canceled, false},
	} {
		err := apiError("create", c.err)
		if errors.Is(err, sessions.ErrUnavailable) != c.transient || !errors.Is(err, c.err) {
			t.Errorf("apiError(%v) = %v; transient %v", c.err, err, c.transient)
		}
	}
}

// proxy forwards TCP connections to target until cut.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); p.cut(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve(c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	down := p.down
	p.mu.Unlock()
	if down {
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// cut closes every connection and refuses new ones until restore.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// TestAPIServerRestart: the API server stops and comes back (etcd keeps
// the objects): reads go on from the cache meanwhile, writes fail as
// unavailable while it is down and work again after, a waiter from before
// the restart is woken by an outcome written after it, and every record
// is still there.
func TestAPIServerRestart(t *testing.T) {
	e := newEnv(t)
	s := e.startStore(t, storeOpts{})
	other := e.startStore(t, storeOpts{})
	ctx := context.Background()
	exp := time.Now().Add(10 * time.Minute)
	must(t, s.Complete(ctx, "before", exp, "kb-ns", []byte(`{"before":true}`)))
	shows(t, s, "before", sessions.StateCompleted)

	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	got := make(chan sessions.Outcome, 1)
	go func() { o, _ := s.Wait(waitCtx, "after"); got <- o }()

	restarted := make(chan error, 1)
	go func() { restarted <- e.cp.RestartAPIServer(ctx, 2*time.Second) }()
	// While it is down: the cached state is still answered, and a write
	// is refused as transient, never as a client mistake.
	sawDown := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !sawDown; time.Sleep(50 * time.Millisecond) {
		if o, _, err := s.Peek(ctx, "before"); err != nil || o.State != sessions.StateCompleted {
			t.Fatalf("Peek while the API server restarts: %+v, %v", o, err)
		}
		err := s.UseOnce(ctx, fmt.Sprint("probe-", time.Now().UnixNano()), exp)
		if err != nil {
			if !errors.Is(err, sessions.ErrUnavailable) {
				t.Fatalf("a write while the API server is down: %v, want ErrUnavailable", err)
			}
			sawDown = true
		}
	}
	if !sawDown {
		t.Fatal("no write failed: the API server never went down")
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	// Writes work again (the client's connections come back by themselves).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := s.Complete(ctx, "after", exp, "kb-ns", []byte(`{"after":true}`))
		if err == nil {
			break
		}
		if !errors.Is(err, sessions.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Complete after the restart: %v", err)
		}
	}
	// Another replica sees it at once, although its informer may still be
	// waiting out client-go's backoff (up to 30 s) before it lists again.
	start := time.Now()
	for o, _ := other.Outcome(ctx, "after"); o.State != sessions.StateCompleted; o, _ = other.Outcome(ctx, "after") {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("another replica still answers %v 5s after the write", o.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("another replica saw the write after %v", time.Since(start))
	select {
	case o := <-got:
		if o.State != sessions.StateCompleted || string(o.Response) != `{"after":true}` {
			t.Fatalf("the waiter from before the restart got %+v", o)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiter from before the restart was not woken within 60s")
	}
	if o := shows(t, s, "before", sessions.StateCompleted); string(o.Response) != `{"before":true}` {
		t.Fatalf("the record from before the restart: %s", o.Response)
	}
}
