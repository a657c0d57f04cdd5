package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricValueFindsGaugesAndCountersByLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g"}, []string{"phase"})
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"action", "reason"})
	u := prometheus.NewGauge(prometheus.GaugeOpts{Name: "u"})
	reg.MustRegister(g, c, u)
	g.WithLabelValues("Pending").Set(2)
	g.WithLabelValues("Succeeded").Set(3)
	c.WithLabelValues("deleted", "incomplete").Add(4)
	c.WithLabelValues("deleted", "undelivered").Add(5)
	u.Set(6)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"g", []string{"phase", "Succeeded"}, 3},
		{"c_total", []string{"action", "deleted", "reason", "undelivered"}, 5},
		{"c_total", []string{"action", "deleted", "reason", "incomplete"}, 4},
		{"u", nil, 6},
		{"g", []string{"phase", "Failed"}, -1},
		{"missing", nil, -1},
	} {
		if got := MetricValue(t, reg, tc.name, tc.labels...); got != tc.want {
			t.Errorf("MetricValue(%s, %q) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
