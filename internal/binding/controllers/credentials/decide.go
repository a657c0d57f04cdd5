// Package credentials rotates and revokes consumer credentials on the
// provider cluster (docs/binding.md, "Credential lifecycle"): it replaces
// each token before it expires by writing a new kubeconfig into the
// provider-side kubeconfig Secret (the konnector copies it to the consumer
// cluster and restarts with it), revokes a replaced token once the
// konnector has shown it was alive long enough after the replacement to
// switch, and reports on the ClusterBinding, as condition CredentialsValid,
// whether the konnector can still hold a valid token. It ends every
// credential of a binding whose absolute lifetime, counted from the
// user's last bind, is over, or whose user the allow-list no longer
// admits: whoever copied a token once can follow the rotations through
// the kubeconfig Secret, so only a bind by the user may extend access.
//
// Decide is the whole policy, a pure function of the observed state and a
// clock; Controller only observes, acts and requeues. It runs on the
// leader only.
package credentials

import (
	"fmt"
	"time"

	"github.com/kbprovider/backend/internal/binding"
)

// ConditionType is the ClusterBinding condition this package owns.
const ConditionType = "CredentialsValid"

// Reasons of the condition.
const (
	ReasonValid    = "CredentialsValid"
	ReasonExpired  = "CredentialsExpired"
	ReasonRevoked  = "CredentialsRevoked"
	ReasonMigrated = "LegacyTokenMigrating"
	// ReasonBindingExpired: the binding's lifetime since the user's last
	// bind is over; every token is revoked until the user binds again.
	ReasonBindingExpired = "BindingExpired"
	// ReasonUserNotAllowed: the allow-list no longer admits the user who
	// bound; every token is revoked.
	ReasonUserNotAllowed = "UserNotAllowed"
)

// Token is one issued token as its Secrets describe it. Zero times are
// unknown.
type Token struct {
	// Secret is the name of the Secret the token is bound to (or the
	// legacy token Secret).
	Secret string
	// Legacy: a non-expiring token of a legacy token Secret.
	Legacy bool
	// IssuedBy is binding.IssuedByBind or binding.IssuedByRotation.
	IssuedBy  string
	IssuedAt  time.Time
	ExpiresAt time.Time
	// RetiredAt is when another token replaced it (zero: not marked yet).
	RetiredAt time.Time
}

// State is what the controller observed in one provider namespace.
type State struct {
	// Current is the token in the kubeconfig Secret; nil when there is no
	// kubeconfig Secret (nothing to manage yet).
	Current *Token
	// CurrentRevoked: the kubeconfig Secret names a token Secret that no
	// longer exists (someone revoked it).
	CurrentRevoked bool
	// Retired are the other tokens whose Secrets still exist.
	Retired []Token
	// LastHeartbeat is the konnector's last heartbeat on the ClusterBinding.
	LastHeartbeat time.Time
	// RotationRequested is the time in the ClusterBinding's annotation
	// AnnotationRotate: an operator (or a test) asks for a new token now.
	RotationRequested time.Time
	// BoundAt is when the user last bound (binding.AnnotationBoundAt);
	// zero for a binding made before it was recorded.
	BoundAt time.Time
	// NotAllowed: the allow-list no longer admits the user who bound.
	NotAllowed bool
}

// AnnotationRotate on a ClusterBinding, with an RFC 3339 time, asks for
// the token to be replaced if it was issued before that time:
//
//	kubectl -n <ns> annotate clusterbinding cluster --overwrite \
//	  kube-bind.io/rotate-credentials=$(date -u +%Y-%m-%dT%H:%M:%SZ)
//
// (consumers cannot set it: they may not patch their ClusterBinding.)
const AnnotationRotate = "kube-bind.io/rotate-credentials"

// Policy is the configuration of rotation (the --credential-* flags).
type Policy struct {
	Lifetime time.Duration
	// RotationPoint is the fraction of a token's lifetime after which it
	// is replaced.
	RotationPoint float64
	// Overlap: a replaced token is revoked once the konnector sent a
	// heartbeat at least this long after the replacement.
	Overlap time.Duration
	// BindingLifetime is how long after the user's last bind the binding's
	// credentials end (--binding-lifetime); 0: never (a thief who copied
	// a token once follows the rotations for as long as the binding
	// lives).
	BindingLifetime time.Duration
}

// MinBindingLifetimes is the shortest --binding-lifetime, in credential
// lifetimes: a konnector gets at least one rotation between two binds.
const MinBindingLifetimes = 2

// Validate checks the policy; the errors name the flags that set it. The
// backend's command reports them with the others, and New refuses a
// policy that does not pass.
func (p Policy) Validate() []error {
	var errs []error
	if p.Lifetime < binding.MinTokenLifetime {
		errs = append(errs, fmt.Errorf("--credential-lifetime %s: must be at least %s (the API server's minimum)", p.Lifetime, binding.MinTokenLifetime))
	}
	if !(p.RotationPoint > 0 && p.RotationPoint < 1) {
		errs = append(errs, fmt.Errorf("--credential-rotation-point %g: want a fraction between 0 and 1, e.g. 0.8", p.RotationPoint))
	}
	if p.Overlap <= 0 {
		errs = append(errs, fmt.Errorf("--credential-overlap %s: must be positive", p.Overlap))
	}
	if p.BindingLifetime < 0 || p.BindingLifetime > 0 && p.BindingLifetime < MinBindingLifetimes*p.Lifetime {
		errs = append(errs, fmt.Errorf("--binding-lifetime %s: must be 0 (never) or at least %d credential lifetimes (%s with --credential-lifetime %s)",
			p.BindingLifetime, MinBindingLifetimes, MinBindingLifetimes*p.Lifetime, p.Lifetime))
	}
	if len(errs) == 0 {
		if rest := (p.Lifetime - time.Duration(float64(p.Lifetime)*p.RotationPoint)).Round(time.Second); p.Overlap >= rest {
			errs = append(errs, fmt.Errorf("--credential-overlap %s: must be shorter than what remains of a token after its rotation (%s with --credential-lifetime %s and --credential-rotation-point %g), or the konnector has no time to switch",
				p.Overlap, rest, p.Lifetime, p.RotationPoint))
		}
	}
	return errs
}

// Condition is the CredentialsValid condition to report.
type Condition struct {
	Status  string // "True" or "False"
	Reason  string
	Message string
}

// Decision is what to do now.
type Decision struct {
	// Rotate: issue a new token (which retires the current one).
	Rotate bool
	// MarkRetired: token Secrets to annotate as retired now.
	MarkRetired []string
	// Revoke: token Secrets to delete, revoking their tokens.
	Revoke []string
	// Condition to report; nil when there is nothing to report on.
	Condition *Condition
	// RequeueAfter is when to look again without a new event (0: never).
	RequeueAfter time.Duration
	// Due is when the state, unchanged, next needs a decision: a
	// rotation point, an overlap's end, the binding's end (zero: never).
	// RequeueAfter is this, bounded by maxRequeue.
	Due time.Time
	// RecordBoundAt: the binding has no AnnotationBoundAt (made before it
	// was recorded); record now as its start, so its lifetime counts from
	// the upgrade.
	RecordBoundAt bool
}

// maxRequeue bounds how long the controller sleeps on a namespace, so that
// a missed event (or a clock jump) costs at most this much delay.
const maxRequeue = time.Hour

// Decide applies the policy to the state at now.
func Decide(now time.Time, s State, p Policy) Decision {
	var d Decision
	if s.Current == nil {
		return d
	}
	next := time.Time{}
	wake := func(t time.Time) {
		if t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}

	if end, reason := ended(now, s, p); reason != "" {
		return revokeAll(now, s, end, reason)
	}
	if s.BoundAt.IsZero() {
		d.RecordBoundAt = p.BindingLifetime > 0
	} else if p.BindingLifetime > 0 {
		wake(s.BoundAt.Add(p.BindingLifetime))
	}

	cur := *s.Current
	switch {
	case s.CurrentRevoked:
		// Revoked on purpose: do not hand out a new token; a bind does.
	case cur.Legacy || cur.ExpiresAt.IsZero():
		d.Rotate = true // migration of a non-expiring token
	default:
		rotateAt := rotationTime(cur, p)
		requested := !s.RotationRequested.IsZero() && cur.IssuedAt.Before(s.RotationRequested) && !now.Before(s.RotationRequested)
		if requested || !now.Before(rotateAt) {
			d.Rotate = true
		} else {
			wake(rotateAt)
		}
	}

	// Retired tokens: revoke once the konnector lived through the overlap
	// after the replacement, or once they are dead anyway.
	validRetired := false
	for _, t := range s.Retired {
		retiredAt := t.RetiredAt
		if retiredAt.IsZero() {
			d.MarkRetired = append(d.MarkRetired, t.Secret)
			retiredAt = now
		}
		expires := effectiveExpiry(t, retiredAt, p)
		switched := !s.LastHeartbeat.Before(retiredAt.Add(p.Overlap))
		if switched || !now.Before(expires) {
			d.Revoke = append(d.Revoke, t.Secret)
			continue
		}
		validRetired = true
		wake(expires)
		wake(retiredAt.Add(p.Overlap)) // a heartbeat after this revokes
	}

	d.Condition = condition(now, s, validRetired)
	d.Due = next
	if !next.IsZero() {
		d.RequeueAfter = min(next.Sub(now), maxRequeue)
	} else {
		d.RequeueAfter = maxRequeue
	}
	if d.Rotate || len(d.MarkRetired) > 0 {
		d.RequeueAfter = time.Second // look again at the new state
	}
	return d
}

// ended says whether the binding's credentials are over, and since when:
// the user is no longer allowed (now), or its lifetime ended.
func ended(now time.Time, s State, p Policy) (time.Time, string) {
	if s.NotAllowed {
		return now, ReasonUserNotAllowed
	}
	if p.BindingLifetime > 0 && !s.BoundAt.IsZero() {
		if end := s.BoundAt.Add(p.BindingLifetime); !now.Before(end) {
			return end, ReasonBindingExpired
		}
	}
	return time.Time{}, ""
}

// revokeAll revokes every token issued before end (a token issued after
// it comes from a bind the state does not show yet), and issues none.
func revokeAll(now time.Time, s State, end time.Time, reason string) Decision {
	var d Decision
	for _, t := range append([]Token{*s.Current}, s.Retired...) {
		if t == *s.Current && s.CurrentRevoked {
			continue
		}
		if t.IssuedAt.IsZero() || t.IssuedAt.Before(end) {
			d.Revoke = append(d.Revoke, t.Secret)
		}
	}
	msg := fmt.Sprintf("the binding's lifetime ended at %s (it was bound at %s); every token is revoked; bind again to get a new one",
		formatTime(end), formatTime(s.BoundAt))
	if reason == ReasonUserNotAllowed {
		msg = "the user who bound is no longer allowed to bind; every token is revoked"
	}
	d.Condition = &Condition{Status: "False", Reason: reason, Message: msg}
	d.RequeueAfter = maxRequeue
	return d
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

// rotationTime is when a token is due for replacement.
func rotationTime(t Token, p Policy) time.Time {
	life := t.ExpiresAt.Sub(t.IssuedAt)
	if t.IssuedAt.IsZero() || life <= 0 {
		return t.ExpiresAt.Add(-time.Duration(float64(p.Lifetime) * (1 - p.RotationPoint)))
	}
	return t.IssuedAt.Add(time.Duration(float64(life) * p.RotationPoint))
}

// effectiveExpiry is when a retired token stops working: its expiry if
// known, else its issue time plus the lifetime; a legacy token, which
// never expires, is given one lifetime after its retirement.
func effectiveExpiry(t Token, retiredAt time.Time, p Policy) time.Time {
	switch {
	case t.Legacy:
		return retiredAt.Add(p.Lifetime)
	case !t.ExpiresAt.IsZero():
		return t.ExpiresAt
	case !t.IssuedAt.IsZero():
		return t.IssuedAt.Add(p.Lifetime)
	}
	return retiredAt.Add(p.Lifetime)
}

// condition says whether the konnector can still hold a valid token: the
// current one reached it (delivered by the bind, or the konnector was seen
// after it was issued and so could fetch it), or a retired one it may
// still use is valid (it fetches the current one with it).
func condition(now time.Time, s State, olderValid bool) *Condition {
	cur := *s.Current
	if s.CurrentRevoked {
		return &Condition{Status: "False", Reason: ReasonRevoked,
			Message: fmt.Sprintf("the token in the kubeconfig Secret was revoked (its Secret %s is gone); bind again to get a new one", cur.Secret)}
	}
	if cur.Legacy {
		return &Condition{Status: "True", Reason: ReasonMigrated,
			Message: "a non-expiring legacy token is being replaced by an expiring one"}
	}
	currentValid := now.Before(cur.ExpiresAt)
	reached := cur.IssuedBy != binding.IssuedByRotation || !s.LastHeartbeat.Before(cur.IssuedAt)
	if currentValid && reached || olderValid {
		return &Condition{Status: "True", Reason: ReasonValid,
			Message: fmt.Sprintf("the konnector holds a valid token; the current one expires at %s", cur.ExpiresAt.UTC().Format(time.RFC3339))}
	}
	last := "never"
	if !s.LastHeartbeat.IsZero() {
		last = s.LastHeartbeat.UTC().Format(time.RFC3339)
	}
	return &Condition{Status: "False", Reason: ReasonExpired,
		Message: fmt.Sprintf("the konnector did not pick up a rotated token before its previous one expired (last heartbeat %s); bind again to get a new one", last)}
}

// HeartbeatMatters says whether a konnector heartbeat alone could change
// the decision on s: while a replaced token waits for the konnector to
// show it switched, or while the current token came by rotation and no
// heartbeat since shows the konnector has it. Otherwise a heartbeat is no
// news, and the controller need not look (each look costs three reads;
// every konnector heartbeats each 2.5 minutes).
func HeartbeatMatters(s State) bool {
	if s.Current == nil || s.Current.Legacy || len(s.Retired) > 0 {
		return true
	}
	return s.Current.IssuedBy == binding.IssuedByRotation && s.LastHeartbeat.Before(s.Current.IssuedAt)
}
