package ring

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/admission"
	"github.com/kbprovider/backend/internal/sessions/conformance"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// testTimeout is the peer timeout in tests: short, so that a dead peer
// costs little, yet long enough for a loaded machine's TLS handshake.
const testTimeout = 500 * time.Millisecond

func newKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}

// shared stands for the provider cluster's API server: one store all
// replicas of a test share. It counts reads of outcomes' records and can
// alter the response of every recorded outcome it reads, so that a test
// can tell an outcome served from the group's cache from one read again.
type shared struct {
	sessions.Peeker
	reads   atomic.Int64
	altered atomic.Bool
}

func (s *shared) ReadOutcome(ctx context.Context, id, rec string) (sessions.Outcome, error) {
	s.reads.Add(1)
	o, err := s.Peeker.ReadOutcome(ctx, id, rec)
	if s.altered.Load() && o.State == sessions.StateCompleted {
		o.Response = []byte(`{"altered":true}`)
	}
	return o, err
}

// replicaInner is one replica's view of the shared store: poll pace and
// nonces live in the replica's own memory, as with the kube store.
type replicaInner struct {
	sessions.Peeker
	table *admission.Table
	now   func() time.Time
}

func (r *replicaInner) AdmitPoll(_ context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	return r.table.Admit(id, nonce, expires, r.now(), minInterval)
}

type replica struct {
	*Store
	url   string
	table *admission.Table
}

type config struct {
	limits sessions.Limits
	now    func() time.Time
	keys   [][]byte
}

// start starts a replica serving its peer API on a loopback listener; it
// is alone in its ring until SetPeers.
func start(t *testing.T, sh sessions.Peeker, c config) *replica {
	t.Helper()
	if c.now == nil {
		c.now = time.Now
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	table := admission.New(c.limits)
	s, err := New(Options{
		Self: "https://" + ln.Addr().String(), Keys: c.keys, PeerTimeout: testTimeout,
		Inner:  &replicaInner{Peeker: sh, table: table, now: c.now},
		Logger: slog.New(slog.DiscardHandler), Now: c.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &replica{Store: s, url: s.self, table: table}
}

// join makes the replicas, and the extra URLs, one ring.
func join(rs []*replica, extra ...string) {
	urls := append([]string(nil), extra...)
	for _, r := range rs {
		urls = append(urls, r.url)
	}
	for _, r := range rs {
		r.SetPeers(urls)
	}
}

func newRing(t *testing.T, n int, sh sessions.Peeker, c config) []*replica {
	t.Helper()
	if c.keys == nil {
		c.keys = [][]byte{newKey(t)}
	}
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = start(t, sh, c)
	}
	join(rs)
	// Closing the clients first spares each server's Shutdown the wait
	// for its peers to hang up.
	t.Cleanup(func() {
		for _, r := range rs {
			r.transport.CloseIdleConnections()
		}
	})
	return rs
}

// ownedBy returns a session ID, named after tag, that the ring of r
// places on owner.
func ownedBy(t *testing.T, r *replica, owner, tag string) string {
	t.Helper()
	for i := range 10000 {
		id := fmt.Sprintf("%s-%s-%d", t.Name(), tag, i)
		p := r.owner(id)
		if (p == nil && owner == r.url) || (p != nil && p.base == owner) {
			return id
		}
	}
	t.Fatalf("no session ID placed on %s", owner)
	return ""
}

// roundRobin sends each call to the next replica.
type roundRobin struct {
	rs []*replica
	n  atomic.Uint32
}

func (r *roundRobin) next() *Store { return r.rs[int(r.n.Add(1))%len(r.rs)].Store }

func (r *roundRobin) Outcome(ctx context.Context, id string) (sessions.Outcome, error) {
	return r.next().Outcome(ctx, id)
}

func (r *roundRobin) Complete(ctx context.Context, id string, expires time.Time, ns string, response []byte) error {
	return r.next().Complete(ctx, id, expires, ns, response)
}

func (r *roundRobin) Deny(ctx context.Context, id string, expires time.Time, reason string) error {
	return r.next().Deny(ctx, id, expires, reason)
}

func (r *roundRobin) Deliver(ctx context.Context, id string, expires time.Time) (time.Time, error) {
	return r.next().Deliver(ctx, id, expires)
}

func (r *roundRobin) UseOnce(ctx context.Context, key string, expires time.Time) error {
	return r.next().UseOnce(ctx, key, expires)
}

func (r *roundRobin) AdmitPoll(ctx context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	return r.next().AdmitPoll(ctx, id, nonce, expires, minInterval)
}

func (r *roundRobin) Wait(ctx context.Context, id string) (sessions.Outcome, error) {
	return r.next().Wait(ctx, id)
}

func TestConformance(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			conformance.Run(t, func(t *testing.T, limits sessions.Limits, clock *testutil.Clock) sessions.Store {
				sh := memory.New(limits, clock.Now)
				return &roundRobin{rs: newRing(t, n, sh, config{limits: limits, now: clock.Now})}
			})
		})
	}
}

var ctx = context.Background()

func TestNonceSingleUseAcrossReplicas(t *testing.T) {
	rs := newRing(t, 3, memory.New(sessions.Limits{}, nil), config{limits: sessions.Limits{MaxNoncesPerSession: 3}})
	a, b, c := rs[0], rs[1], rs[2]
	exp := time.Now().Add(time.Hour)
	for _, owner := range rs {
		id := ownedBy(t, a, owner.url, "nonce")
		if err := a.AdmitPoll(ctx, id, "n1", exp, 0); err != nil {
			t.Fatalf("first poll: %v", err)
		}
		for _, r := range []*replica{b, c, a} {
			if err := r.AdmitPoll(ctx, id, "n1", exp, 0); !errors.Is(err, sessions.ErrNonceUsed) {
				t.Fatalf("same nonce via another replica: %v, want ErrNonceUsed", err)
			}
		}
		if err := b.AdmitPoll(ctx, id, "n2", exp, 0); err != nil {
			t.Fatal(err)
		}
		if err := c.AdmitPoll(ctx, id, "n3", exp, 0); err != nil {
			t.Fatal(err)
		}
		if err := a.AdmitPoll(ctx, id, "n4", exp, 0); !errors.Is(err, sessions.ErrTooManyNonces) {
			t.Fatalf("beyond the cap: %v, want ErrTooManyNonces", err)
		}

		paced := ownedBy(t, a, owner.url, "paced")
		if err := c.AdmitPoll(ctx, paced, "p1", exp, time.Hour); err != nil {
			t.Fatal(err)
		}
		err := b.AdmitPoll(ctx, paced, "p2", exp, time.Hour)
		var soon *sessions.TooSoonError
		if !errors.As(err, &soon) || !errors.Is(err, sessions.ErrTooSoon) || soon.RetryAfter <= 59*time.Minute || soon.RetryAfter > time.Hour {
			t.Fatalf("poll via another replica within the interval: %v, want a TooSoonError of about 1h", err)
		}
	}
	// Only owners remembered polls; nothing fell back.
	for _, r := range rs {
		if n, _ := r.table.Len(); n != 2 {
			t.Errorf("replica %s remembers %d sessions, want its own 2", r.url, n)
		}
		if f := r.PeerFallbacks(); f != 0 {
			t.Errorf("replica %s fell back %d times", r.url, f)
		}
	}
}

// frozen is a peer that completes TLS and then never answers a request.
func frozen(t *testing.T, sh sessions.Peeker, keys [][]byte) string {
	r := start(t, sh, config{keys: keys})
	release := make(chan struct{})
	srv := &http.Server{
		TLSConfig: r.ServerTLSConfig(),
		Handler:   http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { close(release); srv.Close() })
	return "https://" + ln.Addr().String()
}

// checkAnswersWithout checks that a replica in a ring with a peer that
// does not answer still answers correctly, within about the timeout,
// for the sessions that peer owns.
func checkAnswersWithout(t *testing.T, sh sessions.Peeker, a *replica, dead string) {
	t.Helper()
	exp := time.Now().Add(time.Hour)
	timed := func(what string, f func()) {
		t.Helper()
		begin := time.Now()
		f()
		if d := time.Since(begin); d > 5*time.Second {
			t.Errorf("%s took %s", what, d)
		}
	}
	id := ownedBy(t, a, dead, "s")
	timed("AdmitPoll", func() {
		if err := a.AdmitPoll(ctx, id, "n", exp, 0); err != nil {
			t.Fatalf("AdmitPoll: %v", err)
		}
	})
	timed("AdmitPoll again", func() {
		if err := a.AdmitPoll(ctx, id, "n", exp, 0); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("AdmitPoll of a used nonce: %v", err)
		}
	})
	timed("Outcome of a pending session", func() {
		if o, err := a.Outcome(ctx, id); err != nil || o.State != sessions.StatePending {
			t.Fatalf("Outcome = %+v, %v; want pending", o, err)
		}
	})
	if err := sh.Complete(ctx, id, exp, "kb-ns", []byte(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	timed("Outcome of a completed session", func() {
		if o, err := a.Outcome(ctx, id); err != nil || string(o.Response) != `{"ok":true}` {
			t.Fatalf("Outcome = %+v, %v; want completed", o, err)
		}
	})
	if a.PeerFallbacks() == 0 {
		t.Error("no fallback counted")
	}
}

func TestUnresponsiveOwner(t *testing.T) {
	for name, dead := range map[string]func(*testing.T, sessions.Peeker, [][]byte) string{
		"black hole": func(t *testing.T, _ sessions.Peeker, _ [][]byte) string { return "https://" + procs.HangingListener(t) },
		"frozen":     frozen,
	} {
		t.Run(name, func(t *testing.T) {
			sh := memory.New(sessions.Limits{}, nil)
			keys := [][]byte{newKey(t)}
			a := start(t, sh, config{keys: keys})
			url := dead(t, sh, keys)
			join([]*replica{a}, url)
			checkAnswersWithout(t, sh, a, url)
		})
	}
}

func TestWrongKey(t *testing.T) {
	sh := memory.New(sessions.Limits{}, nil)
	a := start(t, sh, config{keys: [][]byte{newKey(t)}})
	b := start(t, sh, config{keys: [][]byte{newKey(t)}})
	join([]*replica{a, b})
	checkAnswersWithout(t, sh, a, b.url)
	checkAnswersWithout(t, sh, b, a.url)
	if n, _ := b.table.Len(); n != 1 {
		t.Errorf("b remembers %d polls, want only its own 1", n)
	}

	// A client without a certificate never reaches a handler.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, a.url+admitPath, strings.NewReader(`{}`))
	if res, err := tr.RoundTrip(req); err == nil {
		res.Body.Close()
		t.Fatalf("a client without a certificate got %s", res.Status)
	}
}

func TestKeyRotation(t *testing.T) {
	old, cur := newKey(t), newKey(t)
	sh := memory.New(sessions.Limits{}, nil)

	// One step: a new replica and an old one refuse each other; each
	// answers for the other's sessions itself.
	n := start(t, sh, config{keys: [][]byte{cur, old}})
	o := start(t, sh, config{keys: [][]byte{old}})
	join([]*replica{n, o})
	checkAnswersWithout(t, sh, n, o.url)
	checkAnswersWithout(t, sh, o, n.url)

	// Two steps: replicas trusting both keys talk whichever signs.
	x := start(t, sh, config{keys: [][]byte{cur, old}})
	y := start(t, sh, config{keys: [][]byte{old, cur}})
	join([]*replica{x, y})
	exp := time.Now().Add(time.Hour)
	for _, pair := range [][2]*replica{{x, y}, {y, x}} {
		id := ownedBy(t, pair[0], pair[1].url, "s")
		if err := pair[0].AdmitPoll(ctx, id, "n", exp, 0); err != nil {
			t.Fatal(err)
		}
		if err := pair[1].AdmitPoll(ctx, id, "n", exp, 0); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("same nonce at the owner: %v", err)
		}
	}
	if x.PeerFallbacks()+y.PeerFallbacks() != 0 {
		t.Fatalf("replicas trusting both keys fell back %d times", x.PeerFallbacks()+y.PeerFallbacks())
	}
}

func TestOutcomeCaching(t *testing.T) {
	sh := &shared{Peeker: memory.New(sessions.Limits{}, nil)}
	rs := newRing(t, 2, sh, config{})
	exp := time.Now().Add(time.Hour)
	var done, pending []string
	for _, owner := range rs {
		id, denied := ownedBy(t, rs[0], owner.url, "done"), ownedBy(t, rs[0], owner.url, "denied")
		done = append(done, id, denied)
		pending = append(pending, ownedBy(t, rs[0], owner.url, "pending"))
		if err := sh.Complete(ctx, id, exp, "kb-ns", []byte(`{"id":"`+id+`"}`)); err != nil {
			t.Fatal(err)
		}
		if err := sh.Deny(ctx, denied, exp, "no"); err != nil {
			t.Fatal(err)
		}
	}
	read := func() map[string]sessions.Outcome {
		got := map[string]sessions.Outcome{}
		for _, r := range rs {
			for _, id := range append(append([]string(nil), done...), pending...) {
				o, err := r.Outcome(ctx, id)
				if err != nil {
					t.Fatalf("Outcome(%s) via %s: %v", id, r.url, err)
				}
				if prev, seen := got[id]; seen && (prev.State != o.State || !bytes.Equal(prev.Response, o.Response)) {
					t.Fatalf("replicas disagree on %s: %+v, %+v", id, prev, o)
				}
				got[id] = o
			}
		}
		return got
	}
	first := read()
	for _, id := range pending {
		if first[id].State != sessions.StatePending {
			t.Fatalf("%s: %v", id, first[id].State)
		}
	}

	// Responses were read once per session, whichever replicas asked;
	// denials and pending sessions come from each replica's memory.
	if reads, want := sh.reads.Load(), int64(len(rs)); reads != want {
		t.Fatalf("%d reads of records, want one per completed session (%d)", reads, want)
	}
	// Responses come from the group's cache: what the store says later
	// does not reach them.
	sh.altered.Store(true)
	before := sh.reads.Load()
	again := read()
	for _, id := range done {
		if again[id].State != first[id].State || !bytes.Equal(again[id].Response, first[id].Response) {
			t.Fatalf("%s: %+v, want the cached %+v", id, again[id], first[id])
		}
	}
	if reads := sh.reads.Load() - before; reads != 0 {
		t.Fatalf("%d reads of records, want none", reads)
	}
	sh.altered.Store(false)
	for _, id := range pending {
		if err := sh.Complete(ctx, id, exp, "kb-ns", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	for id, o := range read() {
		if o.State == sessions.StatePending {
			t.Fatalf("%s still pending after Complete: a pending outcome was cached", id)
		}
	}
}

func TestNew(t *testing.T) {
	key := newKey(t)
	inner := memory.New(sessions.Limits{}, nil)
	for name, o := range map[string]Options{
		"no self":       {Keys: [][]byte{key}, Inner: inner},
		"http self":     {Self: "http://127.0.0.1:1", Keys: [][]byte{key}, Inner: inner},
		"no port":       {Self: "https://127.0.0.1", Keys: [][]byte{key}, Inner: inner},
		"path":          {Self: "https://127.0.0.1:1/x", Keys: [][]byte{key}, Inner: inner},
		"no key":        {Self: "https://127.0.0.1:1", Inner: inner},
		"short key":     {Self: "https://127.0.0.1:1", Keys: [][]byte{key, key[:31]}, Inner: inner},
		"no inner":      {Self: "https://127.0.0.1:1", Keys: [][]byte{key}},
		"negative time": {Self: "https://127.0.0.1:1", Keys: [][]byte{key}, Inner: inner, PeerTimeout: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	s, err := New(Options{Self: "https://10.0.0.1:8091", Keys: [][]byte{key}, Inner: inner})
	if err != nil {
		t.Fatal(err)
	}
	s.SetPeers([]string{"https://10.0.0.2:8091", "http://bad", "https://10.0.0.1:8091", "https://10.0.0.2:8091"})
	if got := s.Members(); strings.Join(got, " ") != "https://10.0.0.1:8091 https://10.0.0.2:8091" {
		t.Fatalf("Members = %v", got)
	}
}

func TestCADerivation(t *testing.T) {
	key := newKey(t)
	a, _, err := deriveCA(key)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := deriveCA(key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Raw, b.Raw) {
		t.Fatal("the CA of a key differs between derivations")
	}
	c, _, _ := deriveCA(newKey(t))
	if bytes.Equal(a.Raw, c.Raw) {
		t.Fatal("two keys derived one CA")
	}
}

func FuzzAdmitRequest(f *testing.F) {
	valid, _ := json.Marshal(admitRequest{ID: "sess", Nonce: "n", Expires: 1, MinInterval: 2})
	for _, s := range []string{
		string(valid), `{}`, `{"id":"a","expires":1}`, `{"id":"a","expires":1,"x":1}`,
		`{"id":"a","expires":1} {}`, `{"id":"a","expires":-1}`, `[]`, `null`, `{"id":"a","expires":1,"minInterval":-5}`, `{"id":"a","expires":1,"deadline":3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeAdmitRequest(b)
		if err != nil {
			return
		}
		if len(b) > maxAdmitBody || r.ID == "" || len(r.ID) > maxKeyLen || len(r.Nonce) > maxKeyLen || r.Expires <= 0 || r.MinInterval < 0 {
			t.Fatalf("accepted %q as %+v", b, r)
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := decodeAdmitRequest(again)
		if err != nil && len(again) <= maxAdmitBody {
			t.Fatalf("re-encoded %+v refused: %v", r, err)
		}
		if err == nil && r2 != r {
			t.Fatalf("round trip changed %+v to %+v", r, r2)
		}
	})
}

func TestPeerAPI(t *testing.T) {
	rs := newRing(t, 2, memory.New(sessions.Limits{}, nil), config{})
	a, b := rs[0], rs[1]
	send := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, b.url+path, strings.NewReader(body))
		res, err := a.transport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.ProtoMajor != 2 {
			t.Errorf("peers talk %s, want HTTP/2", res.Proto)
		}
		var sb strings.Builder
		_, _ = io.Copy(&sb, res.Body)
		return res.StatusCode, sb.String()
	}
	if code, _ := send(http.MethodGet, outcomePath+"1"+keySep+"unknown", ""); code != http.StatusNoContent {
		t.Errorf("outcome of a record that is not there: %d, want 204", code)
	}
	for _, key := range []string{"unknown", keySep + "unknown", "1" + keySep, "1" + keySep + strings.Repeat("x", maxGroupKeyLen)} {
		if code, _ := send(http.MethodGet, outcomePath+key, ""); code != http.StatusBadRequest {
			t.Errorf("outcome of key %.40q: %d, want 400", key, code)
		}
	}
	for _, body := range []string{`{"id":"s","expires":1,"extra":1}`, `{"id":"s","expires":1}{}`, `{"id":"","expires":1}`, strings.Repeat(" ", maxAdmitBody) + `{"id":"s","expires":1}`} {
		if code, _ := send(http.MethodPost, admitPath, body); code != http.StatusBadRequest {
			t.Errorf("admit %.40q: %d, want 400", body, code)
		}
	}
	exp := time.Now().Add(time.Hour).UnixNano()
	if code, got := send(http.MethodPost, admitPath, fmt.Sprintf(`{"id":"s","nonce":"n","expires":%d,"minInterval":0}`, exp)); code != http.StatusOK || strings.TrimSpace(got) != `{"result":"ok"}` {
		t.Errorf("admit: %d %s", code, got)
	}
	if code, got := send(http.MethodPost, admitPath, `{"id":"s2","nonce":"n","expires":1,"minInterval":0}`); code != http.StatusOK || strings.TrimSpace(got) != `{"result":"sessionOver"}` {
		t.Errorf("admit of an expired session: %d %s", code, got)
	}
	if code, _ := send(http.MethodPost, "/sessions-peer/v3/admit", `{"id":"s","nonce":"n","expires":1,"minInterval":0,"deadline":1}`); code != http.StatusNotFound {
		t.Errorf("admit of the previous version: %d, want 404", code)
	}
}

// answering is a peer that completes TLS and answers every request with
// status.
func answering(t *testing.T, sh sessions.Peeker, keys [][]byte, status int) string {
	return answeringWith(t, sh, keys, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) })
}

// answeringWith is a peer that completes TLS and answers every request
// with h.
func answeringWith(t *testing.T, sh sessions.Peeker, keys [][]byte, h http.HandlerFunc) string {
	r := start(t, sh, config{keys: keys})
	srv := &http.Server{TLSConfig: r.ServerTLSConfig(), Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

// TestOwnerAnswers: an owner that answers without a decision is not
// decided for (ErrUnavailable, no local admission, no fallback counted);
// an owner of another version (404) is, counted under its reason, as is
// an owner refusing the handshake and a dead one.
func TestOwnerAnswers(t *testing.T) {
	sh := memory.New(sessions.Limits{}, nil)
	keys := [][]byte{newKey(t)}
	exp := time.Now().Add(time.Hour)

	a := start(t, sh, config{keys: keys})
	failing := answering(t, sh, keys, http.StatusServiceUnavailable)
	join([]*replica{a}, failing)
	id := ownedBy(t, a, failing, "failing")
	if err := a.AdmitPoll(ctx, id, "n", exp, 0); !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("poll of a failing owner's session: %v, want ErrUnavailable", err)
	}
	if n, _ := a.table.Len(); n != 0 || a.PeerFallbacks() != 0 {
		t.Fatalf("a failing owner was decided for: %d sessions admitted here, %d fallbacks", n, a.PeerFallbacks())
	}

	for reason, other := range map[string]func() string{
		reasonVersion:     func() string { return answering(t, sh, keys, http.StatusNotFound) },
		reasonRefusedTLS:  func() string { return start(t, sh, config{keys: [][]byte{newKey(t)}}).url },
		reasonUnreachable: func() string { return fmt.Sprintf("https://127.0.0.1:%d", procs.FreePort(t)) },
	} {
		b := start(t, sh, config{keys: keys})
		url := other()
		join([]*replica{b}, url)
		id := ownedBy(t, b, url, reason)
		if err := b.AdmitPoll(ctx, id, "n", exp, 0); err != nil {
			t.Fatalf("%s: poll: %v", reason, err)
		}
		if got := b.PeerFallbacksByReason(reason); got != 1 || b.PeerFallbacks() != 1 {
			t.Errorf("%s: %d fallbacks for it of %d, want 1 of 1", reason, got, b.PeerFallbacks())
		}
	}
}

// TestOwnerOutcomeEncodings: an outcome from an owner of a version that
// sends no namespace gets the namespace this replica's memory holds; one
// with a field this version does not know is refused, and read here.
func TestOwnerOutcomeEncodings(t *testing.T) {
	sh := memory.New(sessions.Limits{}, nil)
	keys := [][]byte{newKey(t)}
	exp := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name, answer, want string
		fallbacks          int64
	}{
		// {"old":true}, base64 as encoding/json sends bytes.
		{"without a namespace", `{"State":1,"Response":"eyJvbGQiOnRydWV9","DenyReason":""}`, `{"old":true}`, 0},
		{"with an unknown field", `{"State":1,"Response":"eyJvbGQiOnRydWV9","DenyReason":"","Namespace":"kb-ns","Extra":1}`, `{"new":true}`, 1},
	} {
		a := start(t, sh, config{keys: keys})
		owner := answeringWith(t, sh, keys, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, tc.answer)
		})
		join([]*replica{a}, owner)
		id := ownedBy(t, a, owner, tc.name)
		if err := sh.Complete(ctx, id, exp, "kb-ns", []byte(`{"new":true}`)); err != nil {
			t.Fatal(err)
		}
		o, err := a.Outcome(ctx, id)
		if err != nil || o.State != sessions.StateCompleted || string(o.Response) != tc.want || o.Namespace != "kb-ns" {
			t.Errorf("%s: Outcome %+v, %v; want %s for namespace kb-ns", tc.name, o, err, tc.want)
		}
		if got := a.PeerFallbacksByReason(reasonAnswer); got != tc.fallbacks {
			t.Errorf("%s: %d fallbacks, want %d", tc.name, got, tc.fallbacks)
		}
	}
}

// TestSkewedClocks: replicas whose clocks disagree by up to 5 s either
// way admit each poll nonce exactly once across the ring, keep the pace
// on the owner's clock, and never fall back while the owner answers.
func TestSkewedClocks(t *testing.T) {
	for _, skew := range []time.Duration{0, 1500 * time.Millisecond, -1500 * time.Millisecond, 5 * time.Second, -5 * time.Second} {
		t.Run(fmt.Sprint("skew=", skew), func(t *testing.T) {
			sh := memory.New(sessions.Limits{}, nil)
			keys := [][]byte{newKey(t)}
			// Replica i is i skews ahead of replica 0: each owner has
			// askers ahead of it and behind it.
			rs := make([]*replica, 3)
			for i := range rs {
				clock := testutil.RealClock()
				clock.Advance(time.Duration(i) * skew)
				rs[i] = start(t, sh, config{keys: keys, now: clock.Now})
			}
			join(rs)
			t.Cleanup(func() {
				for _, r := range rs {
					r.transport.CloseIdleConnections()
				}
			})
			exp := time.Now().Add(time.Hour)
			for _, owner := range rs {
				for s := range 5 {
					id := ownedBy(t, rs[0], owner.url, fmt.Sprint("skewed", s))
					admitted := 0
					for _, r := range rs {
						switch err := r.AdmitPoll(ctx, id, "n", exp, 0); {
						case err == nil:
							admitted++
						case !errors.Is(err, sessions.ErrNonceUsed):
							t.Fatalf("poll via %s: %v", r.url, err)
						}
					}
					if admitted != 1 {
						t.Errorf("skew %s: nonce admitted %d times across 3 replicas, want 1", skew, admitted)
					}
					t.Logf("skew %s, owner %s: admissions of one nonce: %d", skew, owner.url, admitted)
				}
				paced := ownedBy(t, rs[0], owner.url, "paced")
				if err := rs[0].AdmitPoll(ctx, paced, "p1", exp, time.Hour); err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					if err := r.AdmitPoll(ctx, paced, "p2", exp, time.Hour); !errors.Is(err, sessions.ErrTooSoon) {
						t.Fatalf("second poll within the interval via %s: %v, want ErrTooSoon", r.url, err)
					}
				}
			}
			for _, r := range rs {
				if f := r.PeerFallbacks(); f != 0 {
					t.Errorf("replica %s fell back %d times with a reachable owner", r.url, f)
				}
			}
		})
	}
}

// TestFlushedOwner: polling many other sessions past the owner's table
// does not make a victim's used poll nonce usable again, on any replica,
// pending or completed within its grace period.
func TestFlushedOwner(t *testing.T) {
	for _, completed := range []bool{false, true} {
		t.Run(fmt.Sprint("completed=", completed), func(t *testing.T) {
			sh := memory.New(sessions.Limits{}, nil)
			const capacity = 16
			rs := newRing(t, 3, sh, config{limits: sessions.Limits{MaxPolledSessions: capacity}})
			owner := rs[1]
			victim := ownedBy(t, rs[0], owner.url, "victim")
			exp := time.Now().Add(time.Hour)
			if err := rs[0].AdmitPoll(ctx, victim, "used", exp, 0); err != nil {
				t.Fatal(err)
			}
			if completed {
				if err := sh.Complete(ctx, victim, exp, "kb-ns", []byte(`{"token":"t"}`)); err != nil {
					t.Fatal(err)
				}
				if _, err := sh.Deliver(ctx, victim, exp); err != nil {
					t.Fatal(err)
				}
			}
			// Sessions created later (expiring later) fill the owner.
			for i := range 4 * capacity {
				id := ownedBy(t, rs[0], owner.url, fmt.Sprint("flood", i))
				if err := rs[i%3].AdmitPoll(ctx, id, "n", exp.Add(time.Duration(i+1)*time.Second), 0); err != nil {
					t.Fatalf("flood poll %d: %v", i, err)
				}
			}
			if n, _ := owner.table.Len(); n > capacity {
				t.Fatalf("the owner remembers %d sessions, more than %d", n, capacity)
			}
			admitted := 0
			for _, r := range rs {
				switch err := r.AdmitPoll(ctx, victim, "used", exp, 0); {
				case err == nil:
					admitted++
				case !errors.Is(err, sessions.ErrSessionOver):
					t.Errorf("replay via %s: %v, want ErrSessionOver", r.url, err)
				}
			}
			t.Logf("replays of a used poll nonce admitted after a flush: %d", admitted)
			if admitted != 0 {
				t.Fatalf("a used poll nonce was admitted %d times after a flush", admitted)
			}
		})
	}
}

// TestTransportReason: a peer that refused this replica's certificate (a
// TLS alert from the other side, as crypto/tls reports it) is a TLS
// failure, not an unreachable peer; a timeout is a timeout; a refused
// connection is unreachable.
func TestTransportReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&url.Error{Op: "Post", URL: "https://peer", Err: &net.OpError{Op: "remote error", Err: errors.New("tls: unknown certificate authority")}}, reasonRefusedTLS},
		{&url.Error{Op: "Post", URL: "https://peer", Err: context.DeadlineExceeded}, reasonTimeout},
		{&url.Error{Op: "Post", URL: "https://peer", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, reasonUnreachable},
	} {
		if got := transportReason(c.err); got != c.want {
			t.Errorf("transportReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
