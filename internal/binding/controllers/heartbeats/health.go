// Package heartbeats tells a provider whether each consumer's konnector
// is still there: it sets the condition Healthy on ClusterBinding
// "cluster" in every consumer namespace from the heartbeats the konnector
// writes (status.lastHeartbeatTime, status.heartbeatInterval), or from
// the renewals of the kbind v2 konnector's Lease the admission policy
// attributed to that namespace (lease.go), and exports
// metrics of all bindings (by health, the oldest heartbeat, export
// requests by phase).
//
// This file is the pure decision; controller.go applies it.
package heartbeats

import (
	"fmt"
	"time"
)

// The condition and its reasons, as they appear on a ClusterBinding.
const (
	ConditionHealthy = "Healthy"
	// ReasonHeartbeatRecent: the last heartbeat is within the tolerance.
	ReasonHeartbeatRecent = "HeartbeatRecent"
	// ReasonNoHeartbeat: no konnector has ever written a heartbeat (none
	// deployed yet, or it cannot reach the provider cluster).
	ReasonNoHeartbeat = "NoHeartbeat"
	// ReasonHeartbeatMissing: heartbeats came, then stopped.
	ReasonHeartbeatMissing = "HeartbeatMissing"

	// Severities of a False condition (kube-bind's condition convention).
	SeverityInfo    = "Info"
	SeverityWarning = "Warning"
)

// Tolerance settings. The released konnector heartbeats every half
// interval, so a binding turns stale only after about four heartbeats in a
// row were missed: one lost write or a konnector restart never flips it.
const (
	// DefaultInterval is assumed when the konnector reports none (or one
	// that does not parse): the released konnector's default.
	DefaultInterval = 5 * time.Minute
	// MaxInterval caps a reported interval, so a konnector cannot stay
	// "healthy" for days by claiming a huge interval.
	MaxInterval = time.Hour
	// DefaultSlack is added to twice the interval, for clock skew between
	// the consumer cluster and the backend and for API server latency.
	DefaultSlack = 30 * time.Second
)

// Heartbeat is what the konnector last reported.
type Heartbeat struct {
	// Last is status.lastHeartbeatTime; zero when there was none.
	Last time.Time
	// Interval is status.heartbeatInterval; 0 when missing or invalid.
	Interval time.Duration
	// Tolerance, if positive, replaces Tolerance(Interval, slack): a
	// provider's setting for the v2 konnector's Lease.
	Tolerance time.Duration
}

// Verdict is the Healthy condition a heartbeat earns at some moment.
type Verdict struct {
	Healthy  bool
	Reason   string
	Severity string // "" when healthy
	Message  string
	// StaleAt is when a healthy verdict turns into HeartbeatMissing unless
	// a newer heartbeat comes; zero for an unhealthy verdict.
	StaleAt time.Time
}

// Tolerance is how old the last heartbeat may be before the binding is
// unhealthy: twice the (capped, defaulted) interval plus slack.
func Tolerance(interval, slack time.Duration) time.Duration {
	return 2*effectiveInterval(interval) + slack
}

func effectiveInterval(d time.Duration) time.Duration {
	switch {
	case d <= 0:
		return DefaultInterval
	case d > MaxInterval:
		return MaxInterval
	}
	return d
}

// Evaluate decides the condition at now. Messages do not contain now, so
// that the condition (and the object) changes only when the verdict does.
// A heartbeat from the future (a consumer clock ahead) counts as recent.
func Evaluate(hb Heartbeat, now time.Time, slack time.Duration) Verdict {
	interval := effectiveInterval(hb.Interval)
	tolerance := Tolerance(hb.Interval, slack)
	if hb.Tolerance > 0 {
		tolerance = hb.Tolerance
	}
	if hb.Last.IsZero() {
		return Verdict{
			Reason: ReasonNoHeartbeat, Severity: SeverityInfo,
			Message: "the konnector has not sent a heartbeat yet; it may not be deployed in the consumer cluster, or it cannot reach this cluster",
		}
	}
	staleAt := hb.Last.Add(tolerance)
	if now.Before(staleAt) || now.Equal(staleAt) {
		return Verdict{
			Healthy: true, Reason: ReasonHeartbeatRecent, StaleAt: staleAt,
			Message: fmt.Sprintf("the konnector sends heartbeats (interval %s)", interval),
		}
	}
	return Verdict{
		Reason: ReasonHeartbeatMissing, Severity: SeverityWarning,
		Message: fmt.Sprintf("no heartbeat since %s; the konnector heartbeats every %s and is considered gone after %s",
			hb.Last.UTC().Format(time.RFC3339), interval, tolerance),
	}
}
