// Command bindbench drives binds at a fixed rate through two replicas of
// cmd/backend, as the chart runs them (ring session store, peers
// over TLS, controllers under leader election), on a real provider
// cluster and a real OpenID Connect provider, and reports bind latency,
// live session records, each replica's memory and CPU, and the API
// server's requests per bind; with --restart, how long a replica killed
// at the end takes to be ready again with the backlog of records.
// README.md says how to run it and what each figure means.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

type options struct {
	rate           float64
	duration       time.Duration
	maxInFlight    int
	users          int
	bindTimeout    time.Duration
	report         time.Duration
	longPoll       bool
	restart        bool
	backend        string
	logLevel       string
	logDir         string
	recordResource string
	backendArgs    []string
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o options
	flag.Float64Var(&o.rate, "rate", 10, "binds started per second, whether earlier ones finished or not (open loop)")
	flag.DurationVar(&o.duration, "duration", 2*time.Minute, "how long binds are started")
	flag.IntVar(&o.maxInFlight, "max-in-flight", 1000, "most binds under way at once; a bind due while this many are under way is not started and counted as dropped")
	flag.IntVar(&o.users, "users", 5, "identity provider users the binds take turns as; each bind makes a new cluster, and the replicas allow a user 10,000 (--max-clusters-per-user at its bound), so users × 10,000 binds at most")
	flag.DurationVar(&o.bindTimeout, "bind-timeout", time.Minute, "longest one bind may take, from creating its session until its poll gets the BindingResponse")
	flag.DurationVar(&o.report, "report-every", 30*time.Second, "print the figures this often during the run")
	flag.BoolVar(&o.longPoll, "long-poll", true, "poll as pollclient does when the provider offers long polling (Prefer: wait); false: plain polls every --poll-interval")
	flag.BoolVar(&o.restart, "restart", false, "at the end, kill one replica (SIGKILL) and time its restart until ready, with the records then present")
	flag.StringVar(&o.backend, "backend", "", "the cmd/backend binary (default: build ./cmd/backend of this checkout)")
	flag.StringVar(&o.logLevel, "backend-log-level", "warn", "the replicas' --log-level (info logs every request)")
	flag.StringVar(&o.logDir, "backend-logs", "", "write each replica's and the identity provider's output to a file in this directory")
	flag.StringVar(&o.recordResource, "record-resource", "secrets", "the resource of the session records, counted by their label "+recordLabel+": a core resource or group/version/resource")
	flag.Var((*stringList)(&o.backendArgs), "backend-arg", "a flag added to both replicas' (repeat it), e.g. --backend-arg=--session-write-rate=100")
	flag.Parse()
	if err := validate(o); err != nil {
		fmt.Fprintln(os.Stderr, "bindbench:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bindbench:", err)
		os.Exit(1)
	}
}

func validate(o options) error {
	switch {
	case o.rate <= 0:
		return fmt.Errorf("--rate %v: want more than 0", o.rate)
	case o.duration <= 0:
		return fmt.Errorf("--duration %v: want more than 0", o.duration)
	case o.maxInFlight < 1:
		return fmt.Errorf("--max-in-flight %d: want 1 or more", o.maxInFlight)
	case o.users < 1:
		return fmt.Errorf("--users %d: want 1 or more", o.users)
	case o.bindTimeout <= 0 || o.report <= 0:
		return fmt.Errorf("--bind-timeout and --report-every must be more than 0")
	}
	if _, err := parseResource(o.recordResource); err != nil {
		return fmt.Errorf("--record-resource: %w", err)
	}
	return nil
}

func run(o options) error {
	// An interrupt ends the load early; the figures so far are printed
	// and everything started is stopped.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "bindbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e := &env{o: o, dir: dir}
	defer e.stop()
	if err := e.start(ctx); err != nil {
		return err
	}
	b, err := newBinder(ctx, e, o.longPoll, o.bindTimeout)
	if err != nil {
		return err
	}
	// One bind before the clock starts: the first login and the
	// connections' set-up are not what is measured.
	if r := b.bind(ctx, 0); r.err != nil {
		return fmt.Errorf("a first bind failed: %w", r.err)
	}

	m, err := newMeasurement(ctx, e)
	if err != nil {
		return err
	}
	fmt.Printf("driving %.4g binds/s for %s (at most %d under way, long polling %t)\n", o.rate, o.duration, o.maxInFlight, o.longPoll)
	reportCtx, stopReports := context.WithCancel(ctx)
	var reports sync.WaitGroup
	reports.Add(1)
	go func() {
		defer reports.Done()
		t := time.NewTicker(o.report)
		defer t.Stop()
		for {
			select {
			case <-reportCtx.Done():
				return
			case <-t.C:
				m.print(ctx, false)
			}
		}
	}()
	drive(ctx, o, b, m.stats)
	stopReports()
	reports.Wait()
	fmt.Println()
	m.print(context.Background(), true)
	if o.restart && ctx.Err() == nil {
		return restart(ctx, e)
	}
	return nil
}

// drive starts a bind every 1/rate seconds for the duration, whatever
// the earlier ones do, at most maxInFlight at once, and waits until the
// started ones have ended.
func drive(ctx context.Context, o options, b *binder, s *stats) {
	slots := make(chan struct{}, o.maxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	s.begin(start)
	for i := 1; ; i++ {
		at := start.Add(time.Duration(float64(i-1) / o.rate * float64(time.Second)))
		if at.Sub(start) >= o.duration {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case slots <- struct{}{}:
		default:
			s.drop()
			continue
		}
		s.start()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.done(b.bind(ctx, i))
		}()
	}
	wg.Wait()
	s.end()
}
