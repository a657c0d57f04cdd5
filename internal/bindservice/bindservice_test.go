package bindservice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/clusterkey"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

func newService(t *testing.T, limits sessions.Limits, p Provisioner) (*Service, *memory.Store, *clusterkey.Key) {
	t.Helper()
	store := memory.New(limits, nil)
	t.Cleanup(store.Close)
	key, err := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Store: store, ClusterKey: key, SessionTTL: time.Minute, Catalog: catalog{}, Provisioner: p})
	if err != nil {
		t.Fatal(err)
	}
	return s, store, key
}

// catalog exports mangodbs.mangodb.com only.
type catalog struct{}

func (catalog) Lookup(group, resource string) (binding.ExportedAPI, bool) {
	return binding.ExportedAPI{}, group == "mangodb.com" && resource == "mangodbs"
}

// provisioner answers with err, else a response naming the consumer.
type provisioner struct{ err error }

func (p provisioner) Provision(_ context.Context, c binding.Consumer, _ string, _ []binding.Resource) (*v1alpha1.BindingResponse, error) {
	if p.err != nil {
		return nil, p.err
	}
	return &v1alpha1.BindingResponse{Kind: v1alpha1.KindBindingResponse,
		Authentication: v1alpha1.BindingAuthentication{OAuth2CodeGrant: &v1alpha1.CodeGrantAuthentication{ID: c.ID()}}}, nil
}

func TestCreatePollSession(t *testing.T) {
	ctx := context.Background()
	s, store, key := newService(t, sessions.Limits{MaxSessions: 2}, nil)
	sess, secret, err := s.CreatePollSession(ctx, "")
	if err != nil || !key.Issued(sess.ID, sess.ClusterID) || secret != key.Secret(sess.ClusterID) {
		t.Fatalf("no cluster ID presented: %+v, secret %q, %v; want an issued ID with its secret", sess, secret, err)
	}
	if got, err := store.Get(ctx, sess.ID); err != nil || got.State != sessions.StatePending || got.ExpiresAt.Sub(got.CreatedAt) != time.Minute {
		t.Fatalf("stored: %+v, %v", got, err)
	}
	earlier := sess.ClusterID // presented again by a client that bound before
	presented, secret, err := s.CreatePollSession(ctx, earlier)
	if err != nil || presented.ClusterID != earlier || secret != "" {
		t.Fatalf("presented cluster ID: %+v, secret %q, %v; want it kept, no secret", presented, secret, err)
	}
	if _, _, err := s.CreatePollSession(ctx, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("at the limit: %v, want ErrBusy", err)
	}
}

func TestSelect(t *testing.T) {
	s, _, _ := newService(t, sessions.Limits{}, nil)
	res, names, err := s.Select([]string{"mangodbs.mangodb.com", "mangodbs.mangodb.com"})
	if err != nil || len(res) != 1 || res[0] != (binding.Resource{Group: "mangodb.com", Resource: "mangodbs"}) || len(names) != 1 {
		t.Fatalf("one API twice: %v %v %v", res, names, err)
	}
	var se *SelectionError
	for _, picked := range [][]string{nil, {"mangodbs.mangodb.com", "secrets.example.com"}, {"nodot"}} {
		if _, _, err := s.Select(picked); !errors.As(err, &se) {
			t.Errorf("%q: %v, want a SelectionError", picked, err)
		}
	}
}

// Bind fills the response for the session's flow and completes the
// session once; what goes wrong is told apart.
func TestBind(t *testing.T) {
	ctx := context.Background()
	consumer := binding.Consumer{Issuer: "https://idp", Subject: "alice"}
	res := []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}

	s, store, _ := newService(t, sessions.Limits{}, provisioner{})
	poll, _, _ := s.CreatePollSession(ctx, "")
	cb, err := s.CreateCallbackSession(ctx, "Zx81QpAbCd", "http://localhost:41234/callback", "cli-session")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sess    sessions.Session
		wantSID string
	}{{poll, poll.ID}, {cb, "cli-session"}} {
		body, err := s.Bind(ctx, c.sess, consumer, c.sess.ClusterID, res)
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
		stored, _ := store.Get(ctx, c.sess.ID)
		if stored.State != sessions.StateCompleted || !bytes.Equal(stored.Response, body) {
			t.Errorf("stored session %v, response kept: %v", stored.State, bytes.Equal(stored.Response, body))
		}
		if _, err := s.Bind(ctx, c.sess, consumer, c.sess.ClusterID, res); !errors.Is(err, ErrAlreadyDone) {
			t.Errorf("second bind: %v, want ErrAlreadyDone", err)
		}
		if err := s.Deny(ctx, c.sess.ID, "too late"); err != nil {
			t.Errorf("deny of a completed session: %v, want nil (left as it is)", err)
		}
	}

	failing, store, _ := newService(t, sessions.Limits{}, provisioner{err: errors.New("apiserver away")})
	sess, _, _ := failing.CreatePollSession(ctx, "")
	if _, err := failing.Bind(ctx, sess, consumer, sess.ClusterID, res); !errors.Is(err, ErrProvisioning) {
		t.Errorf("provisioning failure: %v, want ErrProvisioning", err)
	}
	gone, _, _ := newService(t, sessions.Limits{}, provisioner{err: &binding.NotExportedError{Group: "mangodb.com", Resource: "mangodbs"}})
	var se *SelectionError
	if _, err := gone.Bind(ctx, sess, consumer, sess.ClusterID, res); !errors.As(err, &se) {
		t.Errorf("API no longer exported: %v, want a SelectionError", err)
	}
	if got, _ := store.Get(ctx, sess.ID); got.State != sessions.StatePending {
		t.Errorf("session after failed binds: %v, want pending", got.State)
	}
	if err := failing.Deny(ctx, sess.ID, "cancelled"); err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Get(ctx, sess.ID); got.State != sessions.StateDenied || got.DenyReason != "cancelled" {
		t.Errorf("denied session: %v %q", got.State, got.DenyReason)
	}
}
