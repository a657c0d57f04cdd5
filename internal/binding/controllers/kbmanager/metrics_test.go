package kbmanager

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// controller-runtime's metrics, kept in its own registry, are gathered
// with ours (which has the process's own), labels and all.
func TestRegisterMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kbmanager_test_total", Help: "test"}, []string{"controller", "result"})
	ctrlmetrics.Registry.MustRegister(counter)
	defer ctrlmetrics.Registry.Unregister(counter)
	counter.WithLabelValues("metrics-test", "success").Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "kbmanager_test_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["controller"] == "metrics-test" && labels["result"] == "success" && m.GetCounter().GetValue() >= 1 {
				return
			}
		}
	}
	t.Error("kbmanager_test_total{controller=metrics-test,result=success} is not among the gathered metrics")
}

// controller-runtime's registry holds a Go and process collector (a
// dependency registers them); gathering does not fail where the backend
// has its own.
func TestRegisterMetricsWithRuntimeCollectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}
