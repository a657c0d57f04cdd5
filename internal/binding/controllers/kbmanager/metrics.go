package kbmanager

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// RegisterMetrics makes controller-runtime's metrics part of reg: the
// reconciles and queues of every controller (controller_runtime_*,
// workqueue_*), the client's requests (rest_client_*) and the leader
// election. controller-runtime keeps them in a registry of its own.
func RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(gathered{ctrlmetrics.Registry})
}

// gathered collects what g gathers, as it is: an unchecked collector,
// since controller-runtime's metrics are registered (and described) there.
type gathered struct{ g prometheus.Gatherer }

func (gathered) Describe(chan<- *prometheus.Desc) {}

func (c gathered) Collect(ch chan<- prometheus.Metric) {
	families, err := c.g.Gather()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(prometheus.NewInvalidDesc(err), err)
		return
	}
	for _, f := range families {
		// The process's own are in the backend's registry already.
		if strings.HasPrefix(f.GetName(), "go_") || strings.HasPrefix(f.GetName(), "process_") {
			continue
		}
		for _, m := range f.GetMetric() {
			names := make([]string, len(m.GetLabel()))
			for i, l := range m.GetLabel() {
				names[i] = l.GetName()
			}
			ch <- gatheredMetric{desc: prometheus.NewDesc(f.GetName(), f.GetHelp(), names, nil), m: m}
		}
	}
}

type gatheredMetric struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (g gatheredMetric) Desc() *prometheus.Desc { return g.desc }

func (g gatheredMetric) Write(out *dto.Metric) error {
	proto.Merge(out, g.m)
	return nil
}
