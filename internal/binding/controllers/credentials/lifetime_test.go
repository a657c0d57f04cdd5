package credentials

import (
	"slices"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding"
)

var lifetimePolicy = Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute, BindingLifetime: 30 * 24 * time.Hour}

// Within the binding's lifetime nothing changes, and the controller comes
// back when it ends (or within maxRequeue).
func TestBindingLifetimeRunning(t *testing.T) {
	cur := token("b", binding.IssuedByRotation, 29*24*time.Hour+23*time.Hour)
	s := State{Current: &cur, BoundAt: at(0), LastHeartbeat: at(29*24*time.Hour + 23*time.Hour + time.Minute)}
	d := Decide(at(29*24*time.Hour+23*time.Hour+30*time.Minute), s, lifetimePolicy)
	if d.Rotate || len(d.Revoke) > 0 || d.RequeueAfter != 30*time.Minute {
		t.Fatalf("decision %+v, want nothing and a look at the lifetime's end in 30m", d)
	}
	wantCondition(t, d, "True", ReasonValid)
}

// At the end of the lifetime every token issued before it is revoked, the
// current one and the retired ones (also a legacy one), nothing is
// issued, and the condition says to bind again.
func TestBindingLifetimeEnded(t *testing.T) {
	end := at(30 * 24 * time.Hour)
	cur := token("c", binding.IssuedByRotation, 30*24*time.Hour-time.Hour)
	old := retired(token("b", binding.IssuedByRotation, 30*24*time.Hour-6*time.Hour), at(30*24*time.Hour-time.Hour))
	legacy := Token{Secret: binding.TokenSecretName, Legacy: true, RetiredAt: at(time.Hour)}
	s := State{Current: &cur, Retired: []Token{old, legacy}, BoundAt: at(0), RotationRequested: end}
	d := Decide(end, s, lifetimePolicy)
	if d.Rotate || !slices.Equal(d.Revoke, []string{"c", "b", binding.TokenSecretName}) {
		t.Fatalf("decision %+v, want no rotation and c, b and the legacy token revoked", d)
	}
	wantCondition(t, d, "False", ReasonBindingExpired)
}

// A token issued after the lifetime ended comes from a rebind the cached
// ClusterBinding does not show yet: it is kept.
func TestBindingLifetimeKeepsRebindToken(t *testing.T) {
	cur := token("new", binding.IssuedByBind, 30*24*time.Hour+time.Minute)
	old := retired(token("old", binding.IssuedByRotation, 29*24*time.Hour), at(30*24*time.Hour+time.Minute))
	d := Decide(at(30*24*time.Hour+2*time.Minute), State{Current: &cur, Retired: []Token{old}, BoundAt: at(0)}, lifetimePolicy)
	if !slices.Equal(d.Revoke, []string{"old"}) {
		t.Fatalf("revoke %v, want only the old token", d.Revoke)
	}
	// Once the rebind's time is seen, a new lifetime runs.
	d = Decide(at(30*24*time.Hour+2*time.Minute), State{Current: &cur, BoundAt: at(30*24*time.Hour + time.Minute)}, lifetimePolicy)
	if len(d.Revoke) > 0 || d.Rotate {
		t.Fatalf("decision %+v after the rebind", d)
	}
	wantCondition(t, d, "True", ReasonValid)
}

// A user the allow-list no longer admits loses every token at once.
func TestUserNotAllowed(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	d := Decide(at(time.Hour), State{Current: &cur, BoundAt: at(0), NotAllowed: true}, lifetimePolicy)
	if d.Rotate || !slices.Equal(d.Revoke, []string{"a"}) {
		t.Fatalf("decision %+v", d)
	}
	wantCondition(t, d, "False", ReasonUserNotAllowed)
	// Already revoked: nothing more to delete, the reason stays.
	d = Decide(at(2*time.Hour), State{Current: &cur, CurrentRevoked: true, BoundAt: at(0), NotAllowed: true}, lifetimePolicy)
	if len(d.Revoke) > 0 {
		t.Fatalf("revoke %v", d.Revoke)
	}
	wantCondition(t, d, "False", ReasonUserNotAllowed)
}

// A binding made before the lifetime was recorded gets one from now; with
// the lifetime off, nothing is recorded and nothing ends.
func TestBindingLifetimeUnrecorded(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	if d := Decide(at(400*24*time.Hour), State{Current: &cur}, lifetimePolicy); !d.RecordBoundAt || d.Condition.Reason == ReasonBindingExpired {
		t.Fatalf("decision %+v, want the start recorded and nothing ended", d)
	}
	off := lifetimePolicy
	off.BindingLifetime = 0
	cur = token("a", binding.IssuedByBind, 400*24*time.Hour)
	if d := Decide(at(400*24*time.Hour+time.Hour), State{Current: &cur, BoundAt: at(0)}, off); d.RecordBoundAt || len(d.Revoke) > 0 {
		t.Fatalf("decision %+v with the lifetime off", d)
	}
}

func TestBindingLifetimeValidation(t *testing.T) {
	for _, c := range []struct {
		lifetime time.Duration
		ok       bool
	}{{0, true}, {48 * time.Hour, true}, {720 * time.Hour, true}, {47 * time.Hour, false}, {-time.Hour, false}} {
		p := lifetimePolicy
		p.BindingLifetime = c.lifetime
		if errs := p.Validate(); (len(errs) == 0) != c.ok {
			t.Errorf("--binding-lifetime %s: %v, want ok %v", c.lifetime, errs, c.ok)
		}
	}
}
