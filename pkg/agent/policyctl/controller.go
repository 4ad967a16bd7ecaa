// Package policyctl is the node agent's NetworkPolicy controller: it keeps
// every local pod's stack holding the pod's current policy, and serves the
// plugin's request for a new pod's policy at ADD.
package policyctl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Controller keeps every local pod's stack holding the pod's current
// policy: the cache follows the cluster; on any change (debounced) a
// round compiles each local pod again, and the pusher writes and pushes
// the policies that changed; the reporter tells of it.
//
// Nothing is compiled before every watch has listed once (cache.synced).
// While the API server is away the cache keeps its last view, so the
// stacks keep what they hold.
type Controller struct {
	o        Options
	cache    *cache
	warnings *warnings
	push     *pusher
	report   *reporter

	// kick asks for a pass; one pending kick is enough.
	kick chan struct{}
}

// New makes a controller; Run starts it.
func New(o Options) (*Controller, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("starting the policy controller: %w", err)
	}
	c := &Controller{
		o:      o,
		kick:   make(chan struct{}, 1),
		push:   newPusher(o.Store, o.PushTimeout),
		report: &reporter{log: o.Log, metrics: o.Metrics, node: o.Node, event: o.Event},
	}
	c.warnings = newWarnings(c.report.compileWarnings)
	var err error
	if c.cache, err = newCache(o, c.trigger); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Controller) trigger() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// WaitSynced waits until every watch has listed once, or wait passed.
func (c *Controller) WaitSynced(ctx context.Context, wait time.Duration) error {
	return c.cache.waitSynced(ctx, wait)
}

// Run watches and keeps the stacks in step until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.cache.run(ctx) }()
	defer wg.Wait()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	backoff := c.o.Retry
	said := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-retry.C:
		}
		// Let the changes that come with this one arrive: a kubectl
		// apply of a file of policies is many events within milliseconds.
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.o.Debounce):
		}
		select {
		case <-c.kick:
		default:
		}
		if err := c.cache.synced(); err != nil {
			if !said {
				c.o.Log.Info("waiting for the caches before compiling", "why", err)
				said = true
			}
			continue
		}
		if failed := c.syncAll(ctx); failed > 0 {
			retry.Reset(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = c.o.Retry
		}
	}
}

// nodeAddrs are the node's addresses for a round; without them (logged)
// the round compiles without.
func (c *Controller) nodeAddrs() []netip.Addr {
	node, err := c.o.NodeAddrs()
	if err != nil {
		c.o.Log.Error("reading the node's addresses; compiling without them", "err", err)
	}
	return node
}

// syncAll compiles every local pod and pushes what changed; it returns
// how many pods could not be brought in step.
func (c *Controller) syncAll(ctx context.Context) int {
	start := time.Now()
	snap := c.cache.snapshot()
	node := c.nodeAddrs()
	targets, live := localTargets(c.o.Store, c.o.Log)
	c.push.forget(live)
	r := newRound(snap, node, targets, c.warnings)

	res := passResult{pods: len(targets)}
	var mu sync.Mutex // guards res
	work := make(chan target)
	var wg sync.WaitGroup
	for range min(c.o.Parallel, max(1, len(targets))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				pushed, _, err := c.syncPod(ctx, r, t)
				mu.Lock()
				switch {
				case errors.Is(err, errPodNotCached):
				case err != nil:
					res.failed++
				default:
					res.applied++
					if pushed {
						res.pushed++
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, t := range targets {
		work <- t
	}
	close(work)
	wg.Wait()
	res.took = time.Since(start)
	c.report.pass(res)
	return res.failed
}

// errPodNotCached marks a local pod the pod cache does not hold (yet, or
// any more): its stack keeps what it has.
var errPodNotCached = errors.New("pod not in the agent's cache")

// syncPod compiles t's pod in r and, when its policy changed (or the
// stack's is not known), writes and pushes it. It returns whether it
// pushed and the generation the stack holds.
func (c *Controller) syncPod(ctx context.Context, r *round, t target) (bool, uint64, error) {
	pod := r.pod(t)
	if pod == nil {
		return false, 0, fmt.Errorf("%s: %w", t.podKey(), errPodNotCached)
	}
	ps := c.push.lock(t.key)
	defer ps.mu.Unlock()
	pushed, err := c.push.push(ps, t, r.compile(pod, t))
	if err != nil {
		c.report.pushFailed(ctx, &ps.failures, t, pod.Metadata.UID, err)
		return false, 0, err
	}
	c.report.applied(&ps.failures, t)
	return pushed, ps.applied.Generation, nil
}

// applyNow compiles and pushes one pod on the plugin's request (ADD): it
// returns the generation its stack holds.
func (c *Controller) applyNow(ctx context.Context, t target, wait time.Duration) (uint64, error) {
	if err := c.cache.synced(); err != nil {
		return 0, err
	}
	if !c.cache.hasPod(t.namespace, t.pod) && c.cache.podsErr() != nil {
		// The API server may be back while the watches wait out their
		// backoff: look now.
		c.cache.retry()
	}
	if !c.cache.waitPod(ctx, t.namespace, t.pod, wait) {
		if err := c.cache.podsErr(); err != nil {
			// Fail closed: a pod the agent cannot look up may be selected
			// by any policy, and attaching it open would let in what its
			// policies deny. The runtime retries (code 11) until the API
			// server answers again.
			return 0, fmt.Errorf("pod %s: %w after %s and the API server cannot be reached (%v): "+
				"its NetworkPolicy cannot be known, so it is not attached (fail closed; retried once the API server answers)",
				t.podKey(), errPodNotCached, wait, err)
		}
		return 0, fmt.Errorf("pod %s: %w after %s", t.podKey(), errPodNotCached, wait)
	}
	start := time.Now()
	node := c.nodeAddrs()
	r := newRound(c.cache.snapshot(), node, []target{t}, c.warnings)
	_, gen, err := c.syncPod(ctx, r, t)
	if err == nil {
		c.report.added(time.Since(start))
		// The other local pods' policies may select this one, whose
		// address the API may not show yet: a pass adds it.
		c.trigger()
	}
	return gen, err
}
