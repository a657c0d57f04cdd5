package heartbeats

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
)

// Health classes, the values of the health label.
const (
	healthHealthy          = "healthy"
	healthHeartbeatMissing = "heartbeat_missing"
	healthNoHeartbeat      = "no_heartbeat"
)

// Request phases as counted; a request without a phase is Pending (the
// CRD's default).
var phases = []string{"Pending", "Succeeded", "Failed"}

var (
	bindingsDesc = prometheus.NewDesc("kube_bind_backend_cluster_bindings",
		"ClusterBindings the backend made, by the health of their konnector's heartbeats (healthy, heartbeat_missing, no_heartbeat). "+
			"Reported only by the replica running the controllers.", []string{"health"}, nil)
	oldestDesc = prometheus.NewDesc("kube_bind_backend_oldest_heartbeat_age_seconds",
		"Age of the oldest last heartbeat among the ClusterBindings that have one, i.e. how long the most silent konnector has been silent. "+
			"Absent while no binding has a heartbeat. Reported only by the replica running the controllers.", nil, nil)
	requestsDesc = prometheus.NewDesc("kube_bind_backend_export_requests",
		"APIServiceExportRequests by status.phase (Pending, Succeeded, Failed). Reported only by the replica running the controllers.",
		[]string{"phase"}, nil)
)

// collector computes the metrics from the leader's cache at scrape time,
// so nothing has to be kept in step. On a replica that is not the leader it reports nothing rather than zeros, so that a
// sum over replicas stays right.
type collector struct{ c *Controller }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bindingsDesc
	ch <- oldestDesc
	ch <- requestsDesc
}

func (col collector) Collect(ch chan<- prometheus.Metric) {
	r := col.c.current.Load()
	if r == nil {
		return
	}
	now := r.cfg.Clock.Now()
	counts := map[string]float64{healthHealthy: 0, healthHeartbeatMissing: 0, healthNoHeartbeat: 0}
	var oldest float64
	haveOldest := false
	ctx := context.Background()
	// Every object at every scrape: only the fields counted are decoded.
	bindings, err := kbmanager.ListCached(ctx, r.cache, kbmanager.ClusterBinding)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(bindingsDesc, err)
		return
	}
	for _, cb := range bindings {
		if cb.GetDeletionTimestamp() != nil {
			continue
		}
		var body struct {
			Status struct {
				LastHeartbeatTime any `json:"lastHeartbeatTime"`
				HeartbeatInterval any `json:"heartbeatInterval"`
			} `json:"status"`
		}
		_ = cb.DecodeBody(&body) // the konnector writes the status: what does not decode counts as absent
		last, _ := body.Status.LastHeartbeatTime.(string)
		interval, _ := body.Status.HeartbeatInterval.(string)
		hb, err := r.heartbeat(ctx, heartbeatFrom(last, interval), cb.GetNamespace(), now)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(bindingsDesc, err)
			return
		}
		v := Evaluate(hb, now, r.cfg.Slack)
		switch {
		case v.Healthy:
			counts[healthHealthy]++
		case v.Reason == ReasonNoHeartbeat:
			counts[healthNoHeartbeat]++
		default:
			counts[healthHeartbeatMissing]++
		}
		if !hb.Last.IsZero() {
			age := max(now.Sub(hb.Last).Seconds(), 0)
			if !haveOldest || age > oldest {
				oldest, haveOldest = age, true
			}
		}
	}
	for h, n := range counts {
		ch <- prometheus.MustNewConstMetric(bindingsDesc, prometheus.GaugeValue, n, h)
	}
	if haveOldest {
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, oldest)
	}
	byPhase := map[string]float64{}
	for _, p := range phases {
		byPhase[p] = 0
	}
	requests, err := kbmanager.ListCached(ctx, r.cache, kbmanager.ExportRequest)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(requestsDesc, err)
		return
	}
	for _, req := range requests {
		var body struct {
			Status struct {
				Phase any `json:"phase"`
			} `json:"status"`
		}
		_ = req.DecodeBody(&body)
		phase, _ := body.Status.Phase.(string)
		if phase == "" {
			phase = "Pending"
		}
		if _, known := byPhase[phase]; known {
			byPhase[phase]++
		}
	}
	for p, n := range byPhase {
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.GaugeValue, n, p)
	}
}
