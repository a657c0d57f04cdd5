package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
	"github.com/kbprovider/backend/pkg/protocol"
)

func newService(t *testing.T, limits sessions.Limits, p Provisioner) (*Service, *memory.Store, *clusterkey.Key) {
	t.Helper()
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	return newServiceAt(t, limits, p, clock)
}

func newServiceAt(t *testing.T, limits sessions.Limits, p Provisioner, clock *testutil.Clock) (*Service, *memory.Store, *clusterkey.Key) {
	t.Helper()
	store := memory.New(limits, clock.Now)
	key, err := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sessionkey.New(bytes.Repeat([]byte("s"), 32))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Store: store, Keys: keys, ClusterKey: key, SessionTTL: time.Minute, Grace: limits.Grace,
		Now: clock.Now, Catalog: fakes.Catalog{fakes.MangoDBs}, Provisioner: p})
	if err != nil {
		t.Fatal(err)
	}
	return s, store, key
}

func TestCreatePollSession(t *testing.T) {
	s, store, key := newService(t, sessions.Limits{}, nil)
	sess, clusterID, secret := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if clusterID != clusterkey.NewClusterID(sess.ID) || secret != key.Secret(clusterID) || sess.ClusterID != "" {
		t.Fatalf("no cluster ID presented: %+v, cluster %q, secret %q; want an issued ID with its secret", sess, clusterID, secret)
	}
	opened, err := s.Open(sess.ID)
	if err != nil || opened.Secret != sess.Secret || !opened.ExpiresAt.Equal(sess.ExpiresAt) {
		t.Fatalf("Open of a new session: %+v, %v", opened, err)
	}
	earlier := clusterID // presented again by a client that bound before
	presented, got, secret := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: earlier})
	if got != earlier || secret != "" || presented.ClusterID != earlier {
		t.Fatalf("presented cluster ID: %+v, cluster %q, secret %q; want it kept, no secret", presented, got, secret)
	}
	if o, d, m := store.Len(); o+d+m != 0 {
		t.Fatalf("creating sessions stored %d records, want none", o+d+m)
	}
}

// Open tells a session that is not ours from one that ended.
func TestOpen(t *testing.T) {
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	s, _, _ := newServiceAt(t, sessions.Limits{}, nil, clock)
	sess, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if _, err := s.Open("not-a-session"); !errors.Is(err, ErrUnknownSession) {
		t.Errorf("a malformed ID: %v, want ErrUnknownSession", err)
	}
	other, _ := sessionkey.New(bytes.Repeat([]byte("o"), 32))
	if _, err := s.Open(other.Issue(sessionkey.FlowPoll, "", clock.Now().Add(time.Minute)).ID); !errors.Is(err, ErrExpired) {
		t.Errorf("an ID of another key: %v, want ErrExpired", err)
	}
	clock.Advance(time.Minute)
	if _, err := s.Open(sess.ID); !errors.Is(err, ErrExpired) {
		t.Errorf("after the TTL: %v, want ErrExpired", err)
	}
}

// Deliver serves a response within the grace period after its first
// delivery, and never after.
func TestDeliverGrace(t *testing.T) {
	ctx := context.Background()
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	s, store, _ := newServiceAt(t, sessions.Limits{Grace: 30 * time.Second}, nil, clock)
	sess, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if err := s.Deliver(ctx, sess, sessions.Outcome{}); !errors.Is(err, sessions.ErrNotPending) {
		t.Fatalf("Deliver of a pending session: %v", err)
	}
	if err := store.Complete(ctx, sess.ID, sess.ExpiresAt, "", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	o := outcome(t, s, sess)
	clock.Advance(10 * time.Second)
	if err := s.Deliver(ctx, sess, o); err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	clock.Advance(29 * time.Second)
	if err := s.Deliver(ctx, sess, o); err != nil {
		t.Fatalf("within the grace period: %v", err)
	}
	clock.Advance(2 * time.Second)
	if err := s.Deliver(ctx, sess, o); !errors.Is(err, ErrDelivered) {
		t.Fatalf("after the grace period: %v, want ErrDelivered", err)
	}
}

// outcome reads sess's outcome as a poll does.
func outcome(t *testing.T, s *Service, sess Session) sessions.Outcome {
	t.Helper()
	o, err := s.Outcome(context.Background(), sess)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// Every path that hands a response out marks its binding delivered first,
// with the namespace the bind provisioned; a failed mark hands nothing
// out, and the poll's grace period starts only once the mark is made.
func TestDeliveredMarkedFirst(t *testing.T) {
	ctx := context.Background()
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}
	res := mangodbs
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	p := &fakes.Provisioner{}
	s, _, _ := newServiceAt(t, sessions.Limits{Grace: 30 * time.Second}, p, clock)
	down := fmt.Errorf("connection refused")

	// The poll flow: Bind records the namespace with the response,
	// marks nothing yet (nothing is handed out).
	poll, cluster, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	body, err := s.Bind(ctx, poll, consumer, cluster, res)
	if err != nil {
		t.Fatal(err)
	}
	if m := p.Marked(); len(m) != 0 {
		t.Fatalf("a poll-flow bind marked %v before any poll", m)
	}
	o := outcome(t, s, poll)
	if !bytes.Equal(o.Response, body) || o.Namespace != fakes.ProvisionedNamespace {
		t.Fatalf("the poll reads back %q for namespace %q, want the response %q for %q", o.Response, o.Namespace, body, fakes.ProvisionedNamespace)
	}
	p.MarkErr = down
	if err := s.Deliver(ctx, poll, o); !errors.Is(err, sessions.ErrUnavailable) || !errors.Is(err, down) {
		t.Fatalf("Deliver with the mark failing: %v, want ErrUnavailable wrapping the cause", err)
	}
	// The failed attempt started no grace period: a poll later than the
	// grace after it is still a first delivery.
	clock.Advance(31 * time.Second)
	p.MarkErr = nil
	if err := s.Deliver(ctx, poll, o); err != nil {
		t.Fatalf("Deliver once the mark works: %v", err)
	}
	if m := p.Marked(); len(m) != 1 || m[0] != fakes.ProvisionedNamespace {
		t.Fatalf("marked %v, want [%s]", m, fakes.ProvisionedNamespace)
	}

	// A late poll of a response never handed out before the session
	// ended is refused and marks nothing.
	late, lateCluster, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if _, err := s.Bind(ctx, late, consumer, lateCluster, res); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute + time.Second)
	ended, err := s.OpenPoll(late.ID)
	if err != nil || !ended.Ended {
		t.Fatalf("OpenPoll after the expiry: %+v %v", ended, err)
	}
	if err := s.Deliver(ctx, ended, outcome(t, s, ended)); !errors.Is(err, ErrDelivered) {
		t.Fatalf("first delivery after the expiry: %v, want ErrDelivered", err)
	}
	if m := p.Marked(); len(m) != 1 {
		t.Errorf("a response never handed out was marked: %v", m)
	}

	// The callback flow and POST /api/bind hand the response out at
	// once: marked before Bind returns it, or no response at all.
	cb := callbackSession(s, "http://localhost:41234/callback", "cli-session")
	p.MarkErr = down
	if body, err := s.Bind(ctx, cb, consumer, "abcdef", res); !errors.Is(err, sessions.ErrUnavailable) || body != nil {
		t.Fatalf("callback-flow bind with the mark failing: %q %v, want no response and ErrUnavailable", body, err)
	}
	s.cfg.Offers = fakes.Offers{Items: []offers.Offer{{Name: "db", Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}}}}
	pick := Pick{Offer: s.cfg.Offers.(fakes.Offers).Items[0]}
	if body, err := s.BindDirect(ctx, V1alpha2, consumer, "uid", "token-id", pick); !errors.Is(err, sessions.ErrUnavailable) || body != nil {
		t.Fatalf("BindDirect with the mark failing: %q %v, want no response and ErrUnavailable", body, err)
	}
	p.MarkErr = nil
	if _, err := s.Bind(ctx, cb, consumer, "abcdef", res); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BindDirect(ctx, V1alpha2, consumer, "uid", "token-id", pick); err != nil {
		t.Fatal(err)
	}
	if m := p.Marked(); len(m) != 3 {
		t.Errorf("marked %v, want the callback-flow bind and the direct bind too", m)
	}
}

// An outcome that names no namespace (a record of a version that kept
// none) is not handed out: its binding cannot be marked.
func TestDeliverUnmarkable(t *testing.T) {
	ctx := context.Background()
	p := &fakes.Provisioner{}
	s, store, _ := newService(t, sessions.Limits{}, p)
	sess, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if err := store.Complete(ctx, sess.ID, sess.ExpiresAt, "", []byte(`{"kind":"BindingResponse"}`)); err != nil {
		t.Fatal(err)
	}
	o := outcome(t, s, sess)
	if string(o.Response) != `{"kind":"BindingResponse"}` {
		t.Errorf("response %q", o.Response)
	}
	if err := s.Deliver(ctx, sess, o); !errors.Is(err, ErrBindingGone) {
		t.Errorf("Deliver: %v, want ErrBindingGone", err)
	}
	if m := p.Marked(); len(m) != 0 {
		t.Errorf("marked %v", m)
	}
}

func TestSettleCluster(t *testing.T) {
	s, _, key := newService(t, sessions.Limits{}, nil)
	fresh, issued, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if id, proven := s.SettleCluster(fresh, ""); id != issued || proven {
		t.Errorf("no cluster presented: %q %v, want the issued %q", id, proven, issued)
	}
	presented, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: issued})
	proof := protocol.ClusterProof(key.Secret(issued), presented.ID)
	if id, proven := s.SettleCluster(presented, proof); id != issued || !proven {
		t.Errorf("with its proof: %q %v", id, proven)
	}
	if id, proven := s.SettleCluster(presented, protocol.ClusterProof(key.Secret(issued), fresh.ID)); id == issued || proven {
		t.Errorf("with another session's proof: %q %v, want a new ID", id, proven)
	}
}

func TestSelect(t *testing.T) {
	none, _, _ := newService(t, sessions.Limits{}, nil)
	poll, _, _ := none.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll})
	if _, err := none.Select(poll, []string{"mangodbs.mangodb.com"}); !errors.Is(err, ErrNoProvider) {
		t.Errorf("without a provisioner: %v, want ErrNoProvider", err)
	}
	s, _, _ := newService(t, sessions.Limits{}, &fakes.Provisioner{})
	picks, err := s.Select(poll, []string{"mangodbs.mangodb.com", "mangodbs.mangodb.com"})
	if err != nil || len(picks) != 1 || !picks[0].Offer.Implicit || picks[0].Offer.Name != "mangodbs.mangodb.com" ||
		len(picks[0].Offer.Resources) != 1 || picks[0].Offer.Resources[0].Group != "mangodb.com" || picks[0].Offer.Resources[0].Resource != "mangodbs" {
		t.Fatalf("one API twice: %+v %v", picks, err)
	}
	var se *SelectionError
	for _, picked := range [][]string{nil, {"mangodbs.mangodb.com", "secrets.example.com"}, {"nodot"}} {
		if _, err := s.Select(poll, picked); !errors.As(err, &se) {
			t.Errorf("%q: %v, want a SelectionError", picked, err)
		}
	}
	// A v1alpha1 pick is the API's implicit offer, never an offer of the
	// same name: a template may replace that one.
	s.cfg.Offers = fakes.Offers{Items: []offers.Offer{{Name: "mangodbs.mangodb.com", Description: "a template",
		Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}}}}
	if picks, err := s.Select(poll, []string{"mangodbs.mangodb.com"}); err != nil || !picks[0].Offer.Implicit {
		t.Errorf("a v1alpha1 pick beside a template of its name: %+v %v", picks, err)
	}
}

// Bind fills the response for the session's flow and completes the
// session once; what goes wrong is told apart.
func TestBind(t *testing.T) {
	ctx := context.Background()
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}
	res := mangodbs

	s, _, _ := newService(t, sessions.Limits{}, &fakes.Provisioner{})
	poll, pollCluster, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	cb := callbackSession(s, "http://localhost:41234/callback", "cli-session")
	for _, c := range []struct {
		sess    Session
		wantSID string
	}{{poll, poll.ID}, {cb, "cli-session"}} {
		body, err := s.Bind(ctx, c.sess, consumer, pollCluster, res)
		if err != nil {
			t.Fatal(err)
		}
		var resp v1alpha1.BindingResponse
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		if g := resp.Authentication.OAuth2CodeGrant; g == nil || g.SessionID != c.wantSID || g.ID != consumer.ID() {
			t.Errorf("code grant %+v, want session %s and consumer %s", g, c.wantSID, consumer.ID())
		}
		stored, _ := s.Outcome(ctx, c.sess)
		if c.sess.Flow == sessionkey.FlowCallback {
			// Handed to the CLI's callback at once: nothing recorded.
			if stored.State != sessions.StatePending {
				t.Errorf("a callback-flow bind recorded %v", stored.State)
			}
			continue
		}
		if stored.State != sessions.StateCompleted || !bytes.Equal(stored.Response, body) {
			t.Errorf("stored outcome %v, response kept: %v", stored.State, bytes.Equal(stored.Response, body))
		}
		if _, err := s.Bind(ctx, c.sess, consumer, pollCluster, res); !errors.Is(err, ErrAlreadyDone) {
			t.Errorf("second bind: %v, want ErrAlreadyDone", err)
		}
		if err := s.Deny(ctx, c.sess, "too late"); err != nil {
			t.Errorf("deny of a completed session: %v, want nil (left as it is)", err)
		}
	}

	failing, store, _ := newService(t, sessions.Limits{}, &fakes.Provisioner{Err: errors.New("apiserver away")})
	sess, cluster, _ := failing.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if _, err := failing.Bind(ctx, sess, consumer, cluster, res); !errors.Is(err, ErrProvisioning) {
		t.Errorf("provisioning failure: %v, want ErrProvisioning", err)
	}
	gone, _, _ := newService(t, sessions.Limits{}, &fakes.Provisioner{Err: &binding.NotExportedError{Group: "mangodb.com", Resource: "mangodbs"}})
	var se *SelectionError
	if _, err := gone.Bind(ctx, sess, consumer, cluster, res); !errors.As(err, &se) {
		t.Errorf("API no longer exported: %v, want a SelectionError", err)
	}
	if got, _ := store.Outcome(ctx, sess.ID); got.State != sessions.StatePending {
		t.Errorf("session after failed binds: %v, want pending", got.State)
	}
	if err := failing.Deny(ctx, sess, "cancelled"); err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Outcome(ctx, sess.ID); got.State != sessions.StateDenied || got.DenyReason != "cancelled" {
		t.Errorf("denied session: %v %q", got.State, got.DenyReason)
	}
}

// A response first delivered just before the session expires keeps its
// whole grace period; one never delivered before the expiry is not served.
func TestDeliverAroundExpiry(t *testing.T) {
	ctx := context.Background()
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	s, store, _ := newServiceAt(t, sessions.Limits{Grace: 30 * time.Second}, nil, clock)
	early, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	late, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	for _, sess := range []Session{early, late} {
		if err := store.Complete(ctx, sess.ID, sess.ExpiresAt, "", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Minute - time.Second)
	if err := s.Deliver(ctx, early, outcome(t, s, early)); err != nil {
		t.Fatalf("delivery a second before the expiry: %v", err)
	}
	clock.Advance(20 * time.Second)
	polled, err := s.OpenPoll(early.ID)
	if err != nil || !polled.Ended {
		t.Fatalf("OpenPoll within the grace after the expiry: %+v, %v", polled, err)
	}
	if err := s.Deliver(ctx, polled, outcome(t, s, polled)); err != nil {
		t.Fatalf("within the grace of a delivery made before the expiry: %v", err)
	}
	if _, err := s.Open(early.ID); !errors.Is(err, ErrExpired) {
		t.Fatalf("Open after the expiry: %v, want ErrExpired", err)
	}
	lateSess, err := s.OpenPoll(late.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Deliver(ctx, lateSess, outcome(t, s, lateSess)); !errors.Is(err, ErrDelivered) {
		t.Fatalf("first delivery after the expiry: %v, want ErrDelivered", err)
	}
	clock.Advance(15 * time.Second)
	if _, err := s.OpenPoll(early.ID); !errors.Is(err, ErrExpired) {
		t.Fatalf("OpenPoll after expiry plus grace: %v, want ErrExpired", err)
	}
}

// The generations the tests bind: renderV1alpha1 and renderPicks stand
// for the renderers their packages register.
func init() {
	Register(Generation{Name: V1alpha1, Render: renderV1alpha1})
	Register(Generation{Name: V1alpha2, Render: renderPicks, PicksOffers: true})
}

// mangodbs picks the implicit offer of the test catalog's one API.
var mangodbs = []Pick{{Offer: offers.Implicit(fakes.MangoDBs)}}

// renderV1alpha1 renders the authentication of a v1alpha1 response.
func renderV1alpha1(r Result) ([]byte, error) {
	return json.Marshal(v1alpha1.BindingResponse{APIVersion: v1alpha1.GroupVersion, Kind: v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{SessionID: r.SessionID, ID: r.ConsumerID}}})
}

func callbackSession(s *Service, callbackURL, cliSession string) Session {
	sess, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowCallback, CallbackURL: callbackURL, CallbackSessionID: cliSession})
	return sess
}

// renderPicks stands for the v1alpha2 renderer: the session and the
// request names.
func renderPicks(r Result) ([]byte, error) {
	var names []string
	for _, p := range r.Picks {
		names = append(names, p.RequestName())
	}
	return json.Marshal(map[string]any{"sid": r.SessionID, "requests": names, "namespace": r.Namespace})
}

// TestBindV1alpha2: the v1alpha2 flows bind offers and render with their
// renderer; only the polled one records its outcome; a session is never
// bound with the other generation's selection.
func TestBindV1alpha2(t *testing.T) {
	ctx := context.Background()
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}
	s, store, _ := newService(t, sessions.Limits{}, &fakes.Provisioner{})
	s.cfg.Offers = fakes.Offers{Items: []offers.Offer{{Name: "db", Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}}}}

	v2, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPollV1alpha2})
	if _, err := s.Select(v2, []string{"db", "nope"}); err == nil {
		t.Error("an unknown offer was selected")
	}
	picks, err := s.Select(v2, []string{"db", "db"})
	if err != nil || len(picks) != 1 {
		t.Fatalf("SelectOffers: %+v %v", picks, err)
	}
	poll, cluster, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPollV1alpha2})
	body, err := s.Bind(ctx, poll, consumer, cluster, picks)
	if err != nil || string(body) != `{"namespace":"`+fakes.ProvisionedNamespace+`","requests":["db"],"sid":"`+poll.ID+`"}` {
		t.Fatalf("BindOffers: %s %v", body, err)
	}
	if o, _ := store.Outcome(ctx, poll.ID); o.State != sessions.StateCompleted {
		t.Errorf("v1alpha2 poll session: %v", o.State)
	}
	browser, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowBrowserV1alpha2, CallbackURL: "http://127.0.0.1:1/callback", CallbackSessionID: "cli-sid"})
	body, err = s.Bind(ctx, browser, consumer, "uid", picks)
	if err != nil || !strings.Contains(string(body), `"sid":"cli-sid"`) {
		t.Errorf("browser flow: %s %v", body, err)
	}
	if o, _ := store.Outcome(ctx, browser.ID); o.State != sessions.StatePending {
		t.Errorf("browser flow recorded %v", o.State)
	}
	if err := s.Deny(ctx, browser, "no"); err != nil {
		t.Errorf("Deny of a browser-flow session: %v", err)
	}
	body, err = s.BindDirect(ctx, V1alpha2, consumer, "uid", "token-id", Pick{Name: "my-db", Offer: picks[0].Offer})
	if err != nil || !strings.Contains(string(body), `"requests":["my-db"],"sid":"token-id"`) {
		t.Errorf("BindDirect: %s %v", body, err)
	}
	// A v1alpha1 session binds APIs, never a template's offer.
	v1, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	if _, err := s.Bind(ctx, v1, consumer, cluster, picks); err == nil {
		t.Error("a v1alpha1 session bound a template's offer")
	}
	if _, err := s.Bind(ctx, browser, consumer, "uid", mangodbs); err != nil {
		t.Errorf("a v1alpha2 session could not bind an implicit offer: %v", err)
	}
}

// A bind refused for the user's own state (the cap, an unproven cluster)
// is a RefusedError with words for the user, not a provisioning failure;
// a poll session is denied with those words, so that its client shows
// them. Only a poll session's cluster ID counts as issued.
func TestBindRefused(t *testing.T) {
	ctx := context.Background()
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}
	res := mangodbs
	p := &fakes.Provisioner{}
	s, store, _ := newService(t, sessions.Limits{}, p)

	poll, cluster, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	p.FailNext(&binding.ClusterCapError{Cap: 10, Have: 10})
	_, err := s.Bind(ctx, poll, consumer, cluster, res)
	var refused *RefusedError
	if !errors.As(err, &refused) || !errors.Is(err, binding.ErrClusterCap) || errors.Is(err, ErrProvisioning) ||
		!strings.Contains(refused.Reason, "at most 10 clusters per user") {
		t.Fatalf("cap: %v, want a RefusedError naming the cap", err)
	}
	if got, _ := store.Outcome(ctx, poll.ID); got.State != sessions.StateDenied || got.DenyReason != refused.Reason {
		t.Errorf("poll session after the refusal: %v %q, want denied with the reason", got.State, got.DenyReason)
	}
	if calls := p.Take(); len(calls) != 1 || calls[0].Consumer.Proof != binding.ProofIssued {
		t.Errorf("a poll-flow bind did not say its cluster ID is issued: %+v", calls)
	}

	cb := callbackSession(s, "http://localhost:41234/callback", "cli-session")
	p.FailNext(fmt.Errorf("namespace kb-x: %w", binding.ErrClusterNotProven))
	if _, err := s.Bind(ctx, cb, consumer, "abcdef", res); !errors.As(err, &refused) || !strings.Contains(refused.Reason, "poll flow") {
		t.Errorf("unproven: %v, want a RefusedError naming the poll flow", err)
	}
	if calls := p.Take(); len(calls) != 1 || calls[0].Consumer.Proof != binding.ProofLogin {
		t.Errorf("a callback-flow bind did not vouch by its login: %+v", calls)
	}
}

// TestSelectOneRequestPerResource: two offers that bind one resource
// (a template and the CRD's own implicit offer) cannot both be picked:
// each would become an export request for it in the consumer's namespace,
// the second refused, the bind half made. The refusal names both and the
// resource, whatever the order of the picks; offers of different
// resources, and one offer picked twice, are fine. Bind refuses such picks
// too, whoever made them, and provisions nothing.
func TestSelectOneRequestPerResource(t *testing.T) {
	ctx := context.Background()
	p := &fakes.Provisioner{}
	s, store, _ := newService(t, sessions.Limits{}, p)
	widgets := v1alpha2.Resource{Group: "interop.example.com", Resource: "widgets"}
	s.cfg.Offers = fakes.Offers{Items: []offers.Offer{
		{Name: "widgets", Resources: []v1alpha2.Resource{widgets, {Group: "interop.example.com", Resource: "gadgets"}}},
		{Name: "widgets.interop.example.com", Implicit: true, Resources: []v1alpha2.Resource{widgets}},
		{Name: "db", Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}},
	}}

	v2, _, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPollV1alpha2})
	for _, picked := range [][]string{
		{"widgets", "db", "widgets.interop.example.com"},
		{"widgets.interop.example.com", "widgets"},
		{"db", "widgets.interop.example.com", "db", "widgets"},
	} {
		picks, err := s.Select(v2, picked)
		var problem *SelectionError
		if !errors.As(err, &problem) || !strings.Contains(problem.Problem, "both bind widgets.interop.example.com: pick only one") ||
			!strings.Contains(problem.Problem, "widgets and widgets.interop.example.com") && !strings.Contains(problem.Problem, "widgets.interop.example.com and widgets ") {
			t.Errorf("Select(%q): %d picks, %v; want both offers of widgets refused, named", picked, len(picks), err)
		}
	}
	for _, ok := range [][]string{{"widgets", "db"}, {"db", "widgets"}, {"widgets.interop.example.com", "db"}, {"widgets", "widgets"}} {
		if picks, err := s.Select(v2, ok); err != nil || len(picks) != len(slices.Compact(slices.Clone(ok))) {
			t.Errorf("Select(%q): %d picks, %v", ok, len(picks), err)
		}
	}

	tmpl, _ := s.cfg.Offers.Get("widgets")
	crd, _ := s.cfg.Offers.Get("widgets.interop.example.com")
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}
	_, err := s.Bind(ctx, v2, consumer, "abcdef", []Pick{{Offer: crd}, {Name: "renamed", Offer: tmpl}})
	var problem *SelectionError
	if !errors.As(err, &problem) || !strings.Contains(problem.Problem, "both bind widgets.interop.example.com") {
		t.Errorf("Bind of overlapping picks: %v, want a SelectionError", err)
	}
	if calls := p.Take(); len(calls) != 0 {
		t.Errorf("Bind of overlapping picks provisioned %+v", calls)
	}
	if got, _ := store.Outcome(ctx, v2.ID); got.State != sessions.StatePending {
		t.Errorf("after the refused bind the session is %v, want pending (the user picks again)", got.State)
	}
}

// TestBindAlreadyBound: a consumer whose cluster binds a resource through
// one request already (an earlier bind of the CRD's own offer) and now
// picks a template of it would get a request the provider refuses after
// the bind: the provisioner's refusal is a SelectionError naming both
// and saying what to do, the session stays pending for another pick, and
// each resource goes to the provisioner with its pick's request name, so
// picking the same offer again (a rebind) binds.
func TestBindAlreadyBound(t *testing.T) {
	ctx := context.Background()
	p := &fakes.Provisioner{Bound: map[string]string{"widgets.interop.example.com": "widgets.interop.example.com"}}
	s, store, _ := newService(t, sessions.Limits{}, p)
	widgets := v1alpha2.Resource{Group: "interop.example.com", Resource: "widgets"}
	tmpl := offers.Offer{Name: "widgets", Resources: []v1alpha2.Resource{widgets, {Group: "interop.example.com", Resource: "gadgets"}}}
	crd := offers.Offer{Name: "widgets.interop.example.com", Implicit: true, Resources: []v1alpha2.Resource{widgets}}
	s.cfg.Offers = fakes.Offers{Items: []offers.Offer{tmpl, crd}}
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}

	sess, cluster, _ := s.CreateSession(SessionRequest{Flow: sessionkey.FlowPollV1alpha2})
	_, err := s.Bind(ctx, sess, consumer, cluster, []Pick{{Offer: tmpl}})
	var problem *SelectionError
	var bound *binding.AlreadyBoundError
	want := "interop.example.com is already bound in this cluster by widgets.interop.example.com, not widgets: pick widgets.interop.example.com to bind it again, or unbind it first."
	if !errors.As(err, &problem) || problem.Problem != "widgets."+want || !errors.As(err, &bound) {
		t.Errorf("Bind of the template: %v, want a SelectionError %q wrapping the AlreadyBoundError", err, "widgets."+want)
	}
	calls := p.Take()
	if len(calls) != 1 || len(calls[0].Resources) != 2 || calls[0].Resources[0].Request != "widgets" || calls[0].Resources[1].Request != "widgets" {
		t.Errorf("provisioned %+v, want both resources of the template under its request", calls)
	}
	if got, _ := store.Outcome(ctx, sess.ID); got.State != sessions.StatePending {
		t.Errorf("after the refused bind the session is %v, want pending (the user picks again)", got.State)
	}

	if _, err := s.Bind(ctx, sess, consumer, cluster, []Pick{{Offer: crd}}); err != nil {
		t.Errorf("rebind of the CRD's own offer: %v", err)
	}
	if calls := p.Take(); len(calls) != 1 || calls[0].Resources[0].Request != "widgets.interop.example.com" {
		t.Errorf("rebind provisioned %+v, want the CRD under its own request", calls)
	}
	// A CLI token's bind names its request itself.
	if _, err := s.BindDirect(ctx, V1alpha2, consumer, cluster, "token-id", Pick{Name: "mine", Offer: crd}); !errors.As(err, &bound) || bound.Request != "mine" {
		t.Errorf("BindDirect under another name: %v, want an AlreadyBoundError for request mine", err)
	}
}
