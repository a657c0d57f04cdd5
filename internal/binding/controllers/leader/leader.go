// Package leader runs a function on one replica at a time, with a Lease
// (client-go leader election): the backend's controllers must not answer
// the same request from two replicas.
package leader

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config says which Lease to hold.
type Config struct {
	Namespace string
	Name      string
	// Identity of this replica in the Lease (e.g. the pod name); it gets
	// a random suffix so that a restarted pod is a new holder.
	Identity string
	Logger   *slog.Logger
	// Durations; 0 means client-go's usual 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Run calls fn while this replica holds the Lease, with a context that
// ends when leadership is lost; then it campaigns again, until ctx ends.
// Run returns when ctx ended, fn returned and the Lease was released.
// On shutdown it releases the Lease, so another replica takes over at
// once rather than after the lease duration.
func Run(ctx context.Context, rc *rest.Config, cfg Config, fn func(ctx context.Context)) error {
	if cfg.Namespace == "" || cfg.Name == "" {
		return errors.New("leader election needs a namespace and a lease name")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	id := cfg.Identity
	if id == "" {
		id, _ = os.Hostname()
	}
	id += "_" + randomSuffix()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, cfg.Namespace, cfg.Name, nil, client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	log := cfg.Logger.With("lease", cfg.Namespace+"/"+cfg.Name, "identity", id)
	// client-go calls OnStartedLeading in a goroutine of its own and does
	// not wait for it: Run does, so that nothing fn started outlives it.
	var (
		mu      sync.Mutex
		running sync.WaitGroup
		done    bool
	)
	defer func() {
		mu.Lock()
		done = true
		mu.Unlock()
		running.Wait()
	}()
	for ctx.Err() == nil {
		log.Info("leader election: campaigning")
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   cfg.LeaseDuration,
			RenewDeadline:   cfg.RenewDeadline,
			RetryPeriod:     cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            cfg.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					mu.Lock()
					if done {
						mu.Unlock()
						return
					}
					running.Add(1)
					mu.Unlock()
					defer running.Done()
					log.Info("leader election: became leader")
					fn(ctx)
				},
				OnStoppedLeading: func() { log.Info("leader election: not leading") },
				OnNewLeader: func(holder string) {
					if holder != id {
						log.Info("leader election: another replica leads", "leader", holder)
					}
				},
			},
		})
	}
	return nil
}

func randomSuffix() string { return strings.ToLower(rand.Text()[:8]) }
