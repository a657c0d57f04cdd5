package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/fakes"
)

func init() {
	Register(Generation{Name: V2, Render: renderV1alpha1, NamespacedOnly: true, RequestsAPIs: true})
}

// replicas are two session services with the same keys over one store,
// as two replicas of the backend share theirs.
func replicas(t *testing.T, p Provisioner) (a, b *Service) {
	t.Helper()
	clock := testutil.ClockAt(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	store := memory.New(sessions.Limits{}, clock.Now)
	key, err := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sessionkey.New(bytes.Repeat([]byte("s"), 32))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []**Service{&a, &b} {
		*s, err = New(Config{Store: store, Keys: keys, ClusterKey: key, SessionTTL: time.Minute,
			Now: clock.Now, Catalog: fakes.Catalog{fakes.MangoDBs}, Provisioner: p})
		if err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// A v2 session binds with a new cluster ID, requests the picked APIs,
// and its outcome is picked up once, with its secret, on whichever
// replica: the second pickup, on the other replica, is refused as used.
func TestPickupOnceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	p := &fakes.Provisioner{}
	a, b := replicas(t, p)
	sess, clusterID, secret := a.CreateSession(SessionRequest{Flow: sessionkey.FlowBrowserV2})
	if clusterID != clusterkey.NewClusterID(sess.ID) || secret != "" {
		t.Fatalf("a v2 session got cluster %q and secret %q, want a new cluster ID and no secret", clusterID, secret)
	}
	if _, err := a.Pickup(ctx, sess, PickupSecret(sess)); !errors.Is(err, ErrPickupPending) {
		t.Fatalf("pickup before the bind: %v, want ErrPickupPending", err)
	}
	body, err := a.Bind(ctx, sess, binding.Consumer{Issuer: "https://idp", Subject: "alice"}, clusterID, mangodbs)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Requested(); len(got) != 1 || got[0] != fakes.ProvisionedNamespace+"/"+fakes.MangoDBs.Name {
		t.Errorf("requested %v", got)
	}
	if _, err := b.Pickup(ctx, sess, PickupSecret(sess)[1:]); !errors.Is(err, ErrPickupDenied) {
		t.Errorf("pickup with a wrong secret: %v, want ErrPickupDenied", err)
	}
	onB, err := b.Open(sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Pickup(ctx, onB, PickupSecret(onB))
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("pickup on the other replica: %q, %v; want the bound response", got, err)
	}
	if _, err := a.Pickup(ctx, sess, PickupSecret(sess)); !errors.Is(err, ErrPickupUsed) {
		t.Errorf("second pickup: %v, want ErrPickupUsed", err)
	}
	if marked := p.Marked(); len(marked) == 0 || marked[0] != fakes.ProvisionedNamespace {
		t.Errorf("marked delivered: %v", marked)
	}

	// A session of another flow has no pickup, with any secret.
	poll, _, _ := a.CreateSession(SessionRequest{Flow: sessionkey.FlowPoll})
	if _, err := a.Pickup(ctx, poll, PickupSecret(poll)); !errors.Is(err, ErrPickupDenied) {
		t.Errorf("pickup of a poll session: %v, want ErrPickupDenied", err)
	}
	// A denied one says why.
	denied, _, _ := a.CreateSession(SessionRequest{Flow: sessionkey.FlowBrowserV2})
	if err := a.Deny(ctx, denied, "the user cancelled the binding"); err != nil {
		t.Fatal(err)
	}
	var de *PickupDeniedError
	if _, err := b.Pickup(ctx, denied, PickupSecret(denied)); !errors.As(err, &de) || de.Reason != "the user cancelled the binding" {
		t.Errorf("pickup of a denied session: %v", err)
	}
}

// A pickup that cannot mark its binding delivered spends nothing: the
// same URL works once the provider cluster answers again.
func TestPickupRetriesAfterAFailedMark(t *testing.T) {
	ctx := context.Background()
	p := &fakes.Provisioner{}
	a, _ := replicas(t, p)
	sess, clusterID, _ := a.CreateSession(SessionRequest{Flow: sessionkey.FlowBrowserV2})
	if _, err := a.Bind(ctx, sess, binding.Consumer{Issuer: "https://idp", Subject: "alice"}, clusterID, mangodbs); err != nil {
		t.Fatal(err)
	}
	p.MarkErr = errors.New("the API server is away")
	if _, err := a.Pickup(ctx, sess, PickupSecret(sess)); !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("pickup with the provider away: %v, want ErrUnavailable", err)
	}
	p.MarkErr = nil
	if _, err := a.Pickup(ctx, sess, PickupSecret(sess)); err != nil {
		t.Errorf("pickup once the provider is back: %v", err)
	}
}
