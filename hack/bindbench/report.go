package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kbprovider/backend/internal/benchutil"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

// stats counts the binds of a run; safe for concurrent use.
type stats struct {
	mu                          sync.Mutex
	begun, ended                time.Time
	started, completed, dropped int
	inFlight                    int
	failed                      map[string]int
	firstErr                    map[string]string // an example of each class
	ready, whole                []time.Duration   // of completed binds, in completion order
	// window: the binds completed and failed since the last report.
	windowFrom, windowFailed int
	windowAt                 time.Time
}

func newStats() *stats { return &stats{failed: map[string]int{}, firstErr: map[string]string{}} }

func (s *stats) begin(t time.Time) {
	s.mu.Lock()
	s.begun, s.windowAt = t, t
	s.mu.Unlock()
}

func (s *stats) drop() {
	s.mu.Lock()
	s.dropped++
	s.mu.Unlock()
}

func (s *stats) start() {
	s.mu.Lock()
	s.started++
	s.inFlight++
	s.mu.Unlock()
}

func (s *stats) done(r bindResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	if r.err != nil {
		c := errorClass(r.err)
		s.failed[c]++
		s.windowFailed++
		if s.firstErr[c] == "" {
			s.firstErr[c] = r.err.Error()
		}
		return
	}
	s.completed++
	s.ready = append(s.ready, r.ready)
	s.whole = append(s.whole, r.whole)
}

func (s *stats) end() {
	s.mu.Lock()
	s.ended = time.Now()
	s.mu.Unlock()
}

// percentiles formats p50, p90, p99 and max of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Sorted(slices.Values(ds))
	f := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return fmt.Sprintf("p50 %s p90 %s p99 %s max %s", f(benchutil.Quantile(ds, 0.5)), f(benchutil.Quantile(ds, 0.9)),
		f(benchutil.Quantile(ds, 0.99)), f(ds[len(ds)-1]))
}

// measurement is what a run reads besides the binds: the API server's
// requests, the processes' CPU, memory and metrics, from the start of
// the load.
type measurement struct {
	e      *env
	stats  *stats
	api0   map[string]float64
	lists0 int
	cpu0   []int64 // each replica's, then the control plane's
	fall0  float64
}

func newMeasurement(ctx context.Context, e *env) (*measurement, error) {
	m := &measurement{e: e, stats: newStats()}
	var err error
	if m.api0, err = e.apiRequests(ctx); err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	m.lists0 = e.ownLists()
	m.cpu0 = m.cpuTicks()
	m.fall0 = m.fallbacks()
	return m, nil
}

// cpuTicks are the CPU times of each replica and of the control plane
// (all its processes), in clock ticks; -1 for one that cannot be read.
func (m *measurement) cpuTicks() []int64 {
	var out []int64
	for _, r := range m.e.reps {
		t, err := benchutil.CPUTicks(r.p.PID())
		if err != nil {
			t = -1
		}
		out = append(out, t)
	}
	var cp int64
	for _, pid := range m.e.cpPids {
		if t, err := benchutil.CPUTicks(pid); err == nil {
			cp += t
		}
	}
	return append(out, cp)
}

// fallbacks sums every replica's peer requests answered locally
// instead (a metric named *peer_fallbacks_total).
func (m *measurement) fallbacks() float64 {
	var f float64
	for _, r := range m.e.reps {
		f += metricSum(r, "peer_fallbacks_total")
	}
	return f
}

func mib(b int64) string { return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20)) }

// print reports the run so far; final adds the totals and the API
// requests per bind by resource and verb.
func (m *measurement) print(ctx context.Context, final bool) {
	s := m.stats
	s.mu.Lock()
	now := time.Now()
	elapsed := now.Sub(s.begun)
	if final && !s.ended.IsZero() {
		elapsed = s.ended.Sub(s.begun)
	}
	started, completed, dropped, inFlight := s.started, s.completed, s.dropped, s.inFlight
	failed := 0
	var classes []string
	for c, n := range s.failed {
		failed += n
		classes = append(classes, fmt.Sprintf("%s ×%d", c, n))
	}
	sort.Strings(classes)
	winReady := slices.Clone(s.ready[s.windowFrom:])
	winWhole := slices.Clone(s.whole[s.windowFrom:])
	winFailed, winSecs := s.windowFailed, now.Sub(s.windowAt).Seconds()
	allReady, allWhole := slices.Clone(s.ready), slices.Clone(s.whole)
	examples := map[string]string{}
	for c, e := range s.firstErr {
		examples[c] = e
	}
	s.windowFrom, s.windowFailed, s.windowAt = len(s.ready), 0, now
	s.mu.Unlock()

	var b strings.Builder
	if final {
		fmt.Fprintf(&b, "TOTAL over %.0fs: ", elapsed.Seconds())
	} else {
		fmt.Fprintf(&b, "[%4.0fs] ", elapsed.Seconds())
	}
	fmt.Fprintf(&b, "binds started %d, completed %d, failed %d, dropped %d, under way %d", started, completed, failed, dropped, inFlight)
	if len(classes) > 0 {
		fmt.Fprintf(&b, " (failed: %s)", strings.Join(classes, ", "))
	}
	b.WriteString("\n")
	if final {
		fmt.Fprintf(&b, "  completed %.2f binds/s; Bind→200: %s; whole bind: %s\n", float64(completed)/elapsed.Seconds(), percentiles(allReady), percentiles(allWhole))
	} else {
		fmt.Fprintf(&b, "  last %.0fs: completed %.2f/s, failed %d; Bind→200: %s; whole bind: %s\n", winSecs,
			float64(len(winReady))/winSecs, winFailed, percentiles(winReady), percentiles(winWhole))
	}

	if n, err := m.e.countRecords(ctx); err != nil {
		fmt.Fprintf(&b, "  session records: (%v)", err)
	} else {
		fmt.Fprintf(&b, "  session records: %d live", n)
	}
	cpu := m.cpuTicks()
	for i, r := range m.e.reps {
		select {
		case <-r.p.Exited():
			fmt.Fprintf(&b, "; %s EXITED", r.name)
			continue
		default:
		}
		rss, peak, err := procs.MemoryOf(r.p.PID())
		if err != nil {
			fmt.Fprintf(&b, "; %s (%v)", r.name, err)
			continue
		}
		fmt.Fprintf(&b, "; %s RSS %s (peak %s), heap in use %s", r.name, mib(rss), mib(peak), mib(int64(metricSum(r, "go_memstats_heap_inuse_bytes"))))
		if completed > 0 && cpu[i] >= 0 && m.cpu0[i] >= 0 {
			fmt.Fprintf(&b, ", CPU %.1fms/bind", float64(cpu[i]-m.cpu0[i])/benchutil.ClockTick*1000/float64(completed))
		}
	}
	last := len(cpu) - 1
	if completed > 0 {
		fmt.Fprintf(&b, "; control plane CPU %.1fms/bind", float64(cpu[last]-m.cpu0[last])/benchutil.ClockTick*1000/float64(completed))
	}
	fmt.Fprintf(&b, "; peer fallbacks %.0f\n", m.fallbacks()-m.fall0)

	api, err := m.e.apiRequests(ctx)
	if err != nil {
		fmt.Fprintf(&b, "  API requests: (%v)\n", err)
	} else if completed > 0 {
		d := benchutil.Sub(api, m.api0)
		// The bench's own counting of the records.
		own := fmt.Sprintf("LIST %s", m.e.records.Resource)
		if d[own] -= float64(m.e.ownLists() - m.lists0); d[own] <= 0 {
			delete(d, own)
		}
		var total float64
		type entry struct {
			what string
			n    float64
		}
		var entries []entry
		for k, v := range d {
			total += v
			entries = append(entries, entry{k, v})
		}
		fmt.Fprintf(&b, "  API requests per completed bind: %.1f", total/float64(completed))
		if final {
			sort.Slice(entries, func(i, j int) bool {
				if entries[i].n != entries[j].n {
					return entries[i].n > entries[j].n
				}
				return entries[i].what < entries[j].what
			})
			var parts []string
			for _, e := range entries {
				parts = append(parts, fmt.Sprintf("%s %.2f", e.what, e.n/float64(completed)))
			}
			fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
		}
		b.WriteString("\n")
	}
	if final && len(examples) > 0 {
		b.WriteString("  a failure of each class:\n")
		var cs []string
		for c := range examples {
			cs = append(cs, c)
		}
		sort.Strings(cs)
		for _, c := range cs {
			fmt.Fprintf(&b, "    %s: %.300s\n", c, examples[c])
		}
	}
	fmt.Print(b.String())
}

// restart kills the second replica as a crash or an OOM kill would, starts
// it again with the same flags, and times it until /readyz answers 200:
// with the records the run left, which it reads before it is ready.
func restart(ctx context.Context, e *env) error {
	r := e.reps[1]
	n, err := e.countRecords(ctx)
	if err != nil {
		return fmt.Errorf("restart: counting the records: %w", err)
	}
	fmt.Printf("\nrestart: %d session records present; killing %s (SIGKILL)\n", n, r.name)
	r.p.Kill()
	t := time.Now()
	if err := r.start(e.bin); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	took := time.Since(t)
	rss, peak, err := procs.MemoryOf(r.p.PID())
	if err != nil {
		return err
	}
	fmt.Printf("restart: %s ready (/readyz 200) %.2fs after its start; RSS %s, peak %s, heap in use %s\n",
		r.name, took.Seconds(), mib(rss), mib(peak), mib(int64(metricSum(r, "go_memstats_heap_inuse_bytes"))))
	return nil
}

// metricSum sums the series of every metric of replica r whose name ends
// in suffix (benchutil.MetricSum).
func metricSum(r *replica, suffix string) float64 {
	return benchutil.MetricSum("http://"+r.diag+"/metrics", suffix)
}
