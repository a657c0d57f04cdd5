package testutil

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// MetricValue gathers reg and returns the value of the first gauge or counter
// named name whose labels include every pair of labels (name, value, name,
// value, ...); -1 when there is none.
func MetricValue(t tb.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("MetricValue: labels %q are not name-value pairs", labels)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue metrics
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}
