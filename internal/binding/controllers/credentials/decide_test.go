package credentials

import (
	"slices"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding"
)

// One test per step of the state machine, on a fake clock: t0 is when the
// first token was issued; the policy is the default (24h, 80%, 10m).
var (
	t0     = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	policy = Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute}
)

func at(d time.Duration) time.Time { return t0.Add(d) }

func token(name, by string, issued time.Duration) Token {
	return Token{Secret: name, IssuedBy: by, IssuedAt: at(issued), ExpiresAt: at(issued + 24*time.Hour)}
}

func retired(t Token, at time.Time) Token {
	t.RetiredAt = at
	return t
}

func wantCondition(t *testing.T, d Decision, status, reason string) {
	t.Helper()
	if d.Condition == nil || d.Condition.Status != status || d.Condition.Reason != reason {
		t.Fatalf("condition %+v, want %s/%s", d.Condition, status, reason)
	}
}

func TestNothingToManageWithoutKubeconfig(t *testing.T) {
	d := Decide(at(0), State{}, policy)
	if d.Rotate || d.Condition != nil || len(d.Revoke) > 0 || d.RequeueAfter != 0 {
		t.Fatalf("decision %+v for a namespace without a kubeconfig Secret", d)
	}
}

// A fresh token is left alone until its rotation point, and the controller
// comes back exactly then.
func TestFreshTokenWaitsForRotationPoint(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	d := Decide(at(time.Hour), State{Current: &cur}, policy)
	if d.Rotate || len(d.Revoke) > 0 {
		t.Fatalf("decision %+v", d)
	}
	if want := time.Duration(float64(24*time.Hour)*0.8) - time.Hour; d.RequeueAfter != min(want, maxRequeue) {
		t.Errorf("requeue after %s, want %s", d.RequeueAfter, min(want, maxRequeue))
	}
	wantCondition(t, d, "True", ReasonValid)
	// Just before the rotation point it sleeps until the point.
	d = Decide(at(19*time.Hour), State{Current: &cur}, policy)
	if d.Rotate || d.RequeueAfter != 12*time.Minute {
		t.Errorf("at 19h: rotate %v, requeue %s, want no rotation and 12m", d.Rotate, d.RequeueAfter)
	}
}

// At 80% of the lifetime the token is rotated.
func TestRotatesAtRotationPoint(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	d := Decide(at(19*time.Hour+12*time.Minute), State{Current: &cur}, policy)
	if !d.Rotate {
		t.Fatal("not rotated at 80% of the lifetime")
	}
	wantCondition(t, d, "True", ReasonValid)
	// The point follows the lifetime the API server granted, not the flag.
	short := Token{Secret: "s", IssuedBy: binding.IssuedByBind, IssuedAt: at(0), ExpiresAt: at(time.Hour)}
	if d := Decide(at(48*time.Minute), State{Current: &short}, policy); !d.Rotate {
		t.Error("a token capped to 1h is not rotated at 48m")
	}
}

// A retired token stays while the konnector has not been seen after the
// overlap; the controller wakes at the end of the overlap.
func TestRetiredTokenKeptUntilKonnectorSwitched(t *testing.T) {
	rotated := at(19*time.Hour + 12*time.Minute)
	old := retired(token("a", binding.IssuedByBind, 0), rotated)
	cur := Token{Secret: "b", IssuedBy: binding.IssuedByRotation, IssuedAt: rotated, ExpiresAt: rotated.Add(24 * time.Hour)}
	s := State{Current: &cur, Retired: []Token{old}, LastHeartbeat: rotated.Add(time.Minute)}
	d := Decide(rotated.Add(2*time.Minute), s, policy)
	if len(d.Revoke) != 0 {
		t.Fatalf("revoked %v two minutes after the rotation", d.Revoke)
	}
	if d.RequeueAfter != 8*time.Minute {
		t.Errorf("requeue after %s, want the end of the overlap (8m)", d.RequeueAfter)
	}
	wantCondition(t, d, "True", ReasonValid)
}

// A heartbeat at least the overlap after the rotation revokes the old token.
func TestHeartbeatAfterOverlapRevokes(t *testing.T) {
	rotated := at(19 * time.Hour)
	old := retired(token("a", binding.IssuedByBind, 0), rotated)
	cur := Token{Secret: "b", IssuedBy: binding.IssuedByRotation, IssuedAt: rotated, ExpiresAt: rotated.Add(24 * time.Hour)}
	s := State{Current: &cur, Retired: []Token{old}, LastHeartbeat: rotated.Add(10 * time.Minute)}
	d := Decide(rotated.Add(11*time.Minute), s, policy)
	if !slices.Equal(d.Revoke, []string{"a"}) {
		t.Fatalf("revoke %v, want [a]", d.Revoke)
	}
	wantCondition(t, d, "True", ReasonValid)
}

// A konnector that stays away keeps the old token until it expires; then
// the old token is removed and the condition turns False, with a hint to
// bind again.
func TestKonnectorDownPastExpiry(t *testing.T) {
	rotated := at(19 * time.Hour)
	old := retired(token("a", binding.IssuedByBind, 0), rotated)
	cur := Token{Secret: "b", IssuedBy: binding.IssuedByRotation, IssuedAt: rotated, ExpiresAt: rotated.Add(24 * time.Hour)}
	s := State{Current: &cur, Retired: []Token{old}, LastHeartbeat: at(18 * time.Hour)}
	d := Decide(at(23*time.Hour), s, policy)
	if len(d.Revoke) != 0 || d.RequeueAfter != time.Hour {
		t.Fatalf("before the old token's expiry: %+v", d)
	}
	wantCondition(t, d, "True", ReasonValid)
	d = Decide(at(24*time.Hour), s, policy)
	if !slices.Equal(d.Revoke, []string{"a"}) {
		t.Fatalf("expired token not removed: %+v", d)
	}
	wantCondition(t, d, "False", ReasonExpired)
}

// A rebind recovers: the token it issued reached the consumer directly.
func TestRebindRecovers(t *testing.T) {
	rebind := at(30 * time.Hour)
	prev := retired(Token{Secret: "b", IssuedBy: binding.IssuedByRotation, IssuedAt: at(19 * time.Hour), ExpiresAt: at(43 * time.Hour)}, rebind)
	cur := Token{Secret: "c", IssuedBy: binding.IssuedByBind, IssuedAt: rebind, ExpiresAt: rebind.Add(24 * time.Hour)}
	d := Decide(rebind.Add(time.Second), State{Current: &cur, Retired: []Token{prev}, LastHeartbeat: at(18 * time.Hour)}, policy)
	wantCondition(t, d, "True", ReasonValid)
	if len(d.Revoke) != 0 {
		t.Errorf("revoked %v before the konnector was seen", d.Revoke)
	}
}

// A token Secret that is not current and not marked (a crash between
// writing the kubeconfig and marking, or a concurrent bind) is marked now.
func TestUnmarkedRetiredTokenIsMarked(t *testing.T) {
	cur := token("b", binding.IssuedByBind, time.Hour)
	stray := token("a", binding.IssuedByBind, 0)
	d := Decide(at(2*time.Hour), State{Current: &cur, Retired: []Token{stray}}, policy)
	if !slices.Equal(d.MarkRetired, []string{"a"}) || len(d.Revoke) != 0 || d.RequeueAfter != time.Second {
		t.Fatalf("decision %+v", d)
	}
}

// A legacy non-expiring token is replaced at once, and kept retired until
// the konnector switched or one lifetime has passed.
func TestLegacyTokenMigrates(t *testing.T) {
	cur := Token{Secret: binding.TokenSecretName, Legacy: true}
	d := Decide(at(0), State{Current: &cur}, policy)
	if !d.Rotate {
		t.Fatal("legacy token not rotated")
	}
	wantCondition(t, d, "True", ReasonMigrated)

	now := at(time.Minute)
	legacy := Token{Secret: binding.TokenSecretName, Legacy: true, RetiredAt: at(0)}
	next := Token{Secret: "b", IssuedBy: binding.IssuedByRotation, IssuedAt: at(0), ExpiresAt: at(24 * time.Hour)}
	d = Decide(now, State{Current: &next, Retired: []Token{legacy}}, policy)
	if len(d.Revoke) != 0 {
		t.Fatalf("legacy token revoked before the konnector switched: %v", d.Revoke)
	}
	d = Decide(at(24*time.Hour), State{Current: &next, Retired: []Token{legacy}}, policy)
	if !slices.Equal(d.Revoke, []string{binding.TokenSecretName}) {
		t.Fatalf("legacy token kept past one lifetime: %+v", d)
	}
}

// A revoked current token is not replaced; the condition says so.
func TestRevokedCurrentIsNotReplaced(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	d := Decide(at(23*time.Hour), State{Current: &cur, CurrentRevoked: true}, policy)
	if d.Rotate {
		t.Fatal("a revoked credential was replaced")
	}
	wantCondition(t, d, "False", ReasonRevoked)
}

// After a long controller outage the expired current token is rotated, and
// since the konnector can only hold an expired one, the condition is False.
func TestControllerOutagePastExpiry(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	d := Decide(at(25*time.Hour), State{Current: &cur, LastHeartbeat: at(24*time.Hour - time.Minute)}, policy)
	if !d.Rotate {
		t.Fatal("expired token not rotated")
	}
	wantCondition(t, d, "False", ReasonExpired)
}

// An operator's (or a test's) request rotates a token issued before it,
// once; a request older than the token does nothing.
func TestRotationRequested(t *testing.T) {
	cur := token("a", binding.IssuedByBind, 0)
	d := Decide(at(time.Hour), State{Current: &cur, RotationRequested: at(time.Hour - time.Second)}, policy)
	if !d.Rotate {
		t.Fatal("requested rotation not done")
	}
	next := token("b", binding.IssuedByRotation, time.Hour)
	d = Decide(at(time.Hour+time.Second), State{Current: &next, RotationRequested: at(time.Hour - time.Second), LastHeartbeat: at(time.Hour)}, policy)
	if d.Rotate {
		t.Fatal("a request older than the current token rotated it again")
	}
	// A request dated in the future waits for its time.
	if d := Decide(at(time.Hour), State{Current: &cur, RotationRequested: at(2 * time.Hour)}, policy); d.Rotate {
		t.Error("a request dated in the future rotated now")
	}
}

// A heartbeat is news only while a replaced token waits for the konnector
// to switch, or while the current token came by rotation and the
// konnector has not heartbeated since: otherwise the controller may
// ignore it.
func TestHeartbeatMatters(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	byBind := &Token{Secret: "t1", IssuedBy: binding.IssuedByBind, IssuedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)}
	byRotation := &Token{Secret: "t2", IssuedBy: binding.IssuedByRotation, IssuedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)}
	for _, c := range []struct {
		name string
		s    State
		want bool
	}{
		{"nothing managed yet", State{}, true},
		{"legacy token", State{Current: &Token{Secret: binding.TokenSecretName, Legacy: true}}, true},
		{"bound, nothing retired", State{Current: byBind, LastHeartbeat: t0.Add(-time.Hour)}, false},
		{"a retired token waits", State{Current: byBind, Retired: []Token{{Secret: "t0", RetiredAt: t0}}, LastHeartbeat: t0.Add(time.Hour)}, true},
		{"rotated, no heartbeat since", State{Current: byRotation, LastHeartbeat: t0.Add(-time.Minute)}, true},
		{"rotated, heartbeat since", State{Current: byRotation, LastHeartbeat: t0.Add(time.Minute)}, false},
	} {
		if got := HeartbeatMatters(c.s); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
