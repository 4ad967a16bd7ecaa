// Package policyctl is the node agent's NetworkPolicy controller: it keeps
// every local pod's stack holding the pod's current policy, and serves the
// plugin's request for a new pod's policy at ADD.
package policyctl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
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
	index    *index
	warnings *warnings
	push     *pusher
	report   *reporter

	// kick asks for a round; one pending kick is enough.
	kick chan struct{}
	// changed is when the first change the next round covers arrived
	// (Unix nanoseconds; 0: none yet), for the round's report of how
	// long a change waited before it was compiled.
	changed atomic.Int64
	// node is the node's addresses the last round compiled with; a
	// change makes the next round compile every pod. targets are the
	// last round's local pods, by attachment key. Run's alone.
	node    []netip.Addr
	targets map[string]target
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
	// The index reads the namespaces' cache, which exists once newCache
	// returned; no change arrives before Run starts the watches.
	c.index = newIndex(func(ns string) map[string]string { return c.cache.namespaceLabels(ns) }, c.trigger)
	var err error
	if c.cache, err = newCache(o, c.index, c.index.markAll); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Controller) trigger() {
	c.changed.CompareAndSwap(0, time.Now().UnixNano())
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
	resync := time.NewTicker(c.o.Resync)
	defer resync.Stop()
	nodeCheck := time.NewTicker(c.o.NodeCheck)
	defer nodeCheck.Stop()
	backoff := c.o.Retry
	said := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-retry.C:
		case <-resync.C:
			c.index.markAll()
		case <-nodeCheck.C:
			if slices.Equal(c.nodeAddrs(), c.node) {
				continue
			}
		}
		if !c.settle(ctx) {
			return
		}
		select {
		case <-c.kick:
		default:
		}
		if err := c.cache.ready(); err != nil {
			if !said {
				c.o.Log.Info("waiting for the caches before compiling", "why", err)
				said = true
			}
			continue
		}
		if failed := c.sync(ctx, c.takeChanged()); failed > 0 {
			retry.Reset(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = c.o.Retry
		}
	}
}

// settle lets the changes that come with the one that woke the loop
// arrive (a kubectl apply of a file of policies is many events within
// milliseconds): it waits until none came for a fifth of the debounce,
// or the whole debounce under a stream of them. It returns false when ctx
// ended. A lone change so waits a fifth of the debounce, not all of it:
// that wait is part of every change's time to be in force.
func (c *Controller) settle(ctx context.Context) bool {
	deadline := time.NewTimer(c.o.Debounce)
	defer deadline.Stop()
	quiet := time.NewTimer(c.o.Debounce / 5)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return true
		case <-quiet.C:
			return true
		case <-c.kick:
			quiet.Reset(c.o.Debounce / 5)
		}
	}
}

// takeChanged returns when the first change since the last round arrived
// (zero: none, the round is a retry, a resync or a node check), and
// starts the count again for the next round.
func (c *Controller) takeChanged() time.Time {
	if n := c.changed.Swap(0); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
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

// sync is a round: it compiles the local pods whose inputs changed (every
// one after a start, a periodic resync or a change of the node's
// addresses), those this agent has not brought in step yet (new, or
// failed), and pushes what changed. It returns how many pods could not be
// brought in step.
func (c *Controller) sync(ctx context.Context, changed time.Time) int {
	start := time.Now()
	all, dirty := c.index.begin()
	snap := c.cache.snapshot()
	node := c.nodeAddrs()
	if !slices.Equal(node, c.node) {
		all, c.node = true, node
	}
	targets, live := localTargets(c.o.Store, c.o.Log)
	c.push.forget(live)
	c.targetsGone(targets)
	livePods := make(map[string]bool, len(targets))
	var todo []target
	for _, t := range targets {
		livePods[t.podKey()] = true
		if all || dirty[t.podKey()] || !c.push.inStep(t.key) {
			todo = append(todo, t)
		}
	}
	r := newRound(snap, c.cache.indexes, c.cache.pod, node, targets, c.warnings)

	res := passResult{pods: len(targets), compiled: len(todo), full: all, changed: changed, start: start}
	compiled := make(map[string]*netpolicy.Deps, len(todo))
	var mu sync.Mutex // guards res and compiled
	work := make(chan target)
	var wg sync.WaitGroup
	for range min(c.o.Parallel, max(1, len(todo))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				var cost podCost
				pushed, deps, err := c.syncPod(ctx, r, t, &cost)
				mu.Lock()
				res.cost.add(cost)
				if pushed {
					res.lastPush = time.Since(start)
				}
				compiled[t.podKey()] = deps
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
	for _, t := range todo {
		work <- t
	}
	close(work)
	wg.Wait()
	c.index.end(compiled, livePods)
	res.inStep = c.push.countInStep()
	res.took = time.Since(start)
	c.report.pass(res)
	if all {
		// A full pass (the first, right after the initial lists, and
		// then one every Resync) compiles every local pod: hand what the
		// lists and the pass took back to the node now rather than over
		// the runtime's minutes of scavenging. At 100k pods this is one
		// collection of a ~100 MiB heap every ten minutes.
		debug.FreeOSMemory()
	}
	return res.failed
}

// targetsGone tells the index of the local pods whose attachments went
// since the last round: the addresses their attachments gave them as
// peers go with them, unless the API has them too.
func (c *Controller) targetsGone(now []target) {
	was := c.targets
	c.targets = make(map[string]target, len(now))
	for _, t := range now {
		c.targets[t.key] = t
	}
	for k, t := range was {
		if _, ok := c.targets[k]; ok {
			continue
		}
		pod := c.cache.pod(t.podKey())
		if pod == nil {
			continue // its deletion told the index already
		}
		c.index.apply(netpolicy.PodChange(attached(pod, t), pod, c.cache.namespaceLabels), "")
	}
}

// attached is pod as a peer sees it while t's attachment exists: with the
// attachment's addresses too.
func attached(pod *netpolicy.Pod, t target) *netpolicy.Pod {
	p := *pod
	p.Status.PodIPs = slices.Clone(pod.Status.PodIPs)
	for _, a := range t.ips {
		p.Status.PodIPs = append(p.Status.PodIPs, netpolicy.PodIP{IP: a.String()})
	}
	return &p
}

// errPodNotCached marks a local pod the pod cache does not hold (yet, or
// any more): its stack keeps what it has.
var errPodNotCached = errors.New("pod not in the agent's cache")

// syncPod compiles t's pod in r and, when its policy changed (or the
// stack's is not known), writes and pushes it. It returns whether it
// pushed and what the policy depends on (nil: the pod is not cached).
// cost, when not nil, receives where the time went.
func (c *Controller) syncPod(ctx context.Context, r *round, t target, cost *podCost) (bool, *netpolicy.Deps, error) {
	pushed, _, deps, err := c.syncPodGen(ctx, r, t, cost)
	return pushed, deps, err
}

// syncPodGen is syncPod that also returns the generation the stack holds.
func (c *Controller) syncPodGen(ctx context.Context, r *round, t target, cost *podCost) (bool, uint64, *netpolicy.Deps, error) {
	pod := r.pod(t)
	if pod == nil {
		return false, 0, nil, fmt.Errorf("%s: %w", t.podKey(), errPodNotCached)
	}
	if cost == nil {
		cost = &podCost{}
	}
	begin := time.Now()
	ps := c.push.lock(t.key)
	defer ps.mu.Unlock()
	cost.lock = time.Since(begin)
	begin = time.Now()
	res := r.compile(pod, t)
	cost.compile = time.Since(begin)
	if c.o.compiled != nil {
		c.o.compiled(t.podKey())
	}
	pushed, err := c.push.push(ps, t, res.Policy, cost)
	if err != nil {
		c.report.pushFailed(ctx, &ps.failures, t, pod.Metadata.UID, err)
		return false, 0, res.Deps, err
	}
	c.report.applied(&ps.failures, t)
	return pushed, ps.applied.generation, res.Deps, nil
}

// applyNow compiles and pushes one pod on the plugin's request (ADD): it
// returns the generation its stack holds.
func (c *Controller) applyNow(ctx context.Context, t target, wait time.Duration) (uint64, error) {
	if err := c.cache.ready(); err != nil {
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
	r := newRound(c.cache.snapshot(), c.cache.indexes, c.cache.pod, node, []target{t}, c.warnings)
	_, gen, _, err := c.syncPodGen(ctx, r, t, nil)
	if err == nil {
		c.report.added(time.Since(start))
		// The next round compiles the pod again, against a snapshot
		// whose later changes it checks against what the pod depends
		// on; the push is skipped when nothing changed.
		c.index.markPod(t.podKey())
		// The other local pods' policies may select this one, whose
		// address the API may not show yet: as a peer it has its
		// attachment's addresses already.
		pod := r.pod(t)
		c.index.apply(netpolicy.PodChange(pod, attached(pod, t), c.cache.namespaceLabels), "")
	}
	return gen, err
}
