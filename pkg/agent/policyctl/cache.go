package policyctl

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/agent/watch"
)

// cache holds the agent's view of the objects a pod's policy depends on,
// one reflector per collection. While the API server is away the
// reflectors keep their last view, so the stacks keep what they hold.
type cache struct {
	policies   *watch.Informer[netpolicy.NetworkPolicy]
	pods       *watch.Informer[netpolicy.Pod]
	namespaces *watch.Informer[netpolicy.Namespace]
	services   *watch.Informer[netpolicy.Service]
	slices     *watch.Informer[netpolicy.EndpointSlice]
	// cnps are the ClusterNetworkPolicies; nil when not watched
	// (Options.ClusterNetworkPolicy).
	cnps *watch.Informer[netpolicy.ClusterNetworkPolicy]
	// status writes the ClusterNetworkPolicies' status condition; nil
	// when they are not watched.
	status *statusWriter
	// synced is called once every collection has listed once.
	synced func()
	// indexes are what rounds share: the pods and namespaces as peers,
	// kept up to date from their changes, and the last service table.
	indexes netpolicy.Indexes

	// podChanged wakes the callers waiting for a pod (waitPod): closed
	// and made anew at each change of the pods.
	podMu      sync.Mutex
	podChanged chan struct{}
}

// changes receives the cache's changes, object by object (old nil: added,
// new nil: deleted), from the reflectors' goroutines: it must not block.
type changes interface {
	policy(old, new *netpolicy.NetworkPolicy)
	pod(old, new *netpolicy.Pod)
	namespace(old, new *netpolicy.Namespace)
	service(old, new *netpolicy.Service)
	slice(old, new *netpolicy.EndpointSlice)
	clusterPolicy(old, new *netpolicy.ClusterNetworkPolicy)
}

// newCache makes the reflectors; ch is told of every change, synced once
// every collection has listed.
func newCache(o Options, ch changes, synced func()) (*cache, error) {
	c := &cache{podChanged: make(chan struct{}), synced: synced,
		indexes: netpolicy.Indexes{Pods: netpolicy.NewPodIndex(), Services: &netpolicy.ServiceTables{}}}
	var err error
	log := o.Log.With("component", "policy-watch")
	// The index first: a change the index then passes on may start a
	// round, which must see it among the peers.
	onPod := func(old, new *netpolicy.Pod) {
		c.indexes.Pods.Pod(old, new)
		ch.pod(old, new)
		c.podMu.Lock()
		close(c.podChanged)
		c.podChanged = make(chan struct{})
		c.podMu.Unlock()
	}
	if c.policies, err = newReflector(o, watch.NetworkPolicies, ch.policy, log); err != nil {
		return nil, err
	}
	if c.pods, err = newReflector(o, watch.Pods, onPod, log); err != nil {
		return nil, err
	}
	onNamespace := func(old, new *netpolicy.Namespace) {
		c.indexes.Pods.Namespace(old, new)
		ch.namespace(old, new)
	}
	if c.namespaces, err = newReflector(o, watch.Namespaces, onNamespace, log); err != nil {
		return nil, err
	}
	if c.services, err = newReflector(o, watch.Services, ch.service, log); err != nil {
		return nil, err
	}
	if c.slices, err = newReflector(o, watch.EndpointSlices, ch.slice, log); err != nil {
		return nil, err
	}
	if o.ClusterNetworkPolicy {
		get := func(name string) (*netpolicy.ClusterNetworkPolicy, bool) { return c.cnps.Get(name) }
		if c.status, err = newStatusWriter(o.Config, o.Log.With("component", "policy-status"), o.statusDelay, get); err != nil {
			return nil, err
		}
		onCNP := func(old, new *netpolicy.ClusterNetworkPolicy) {
			reportClusterPolicy(o, old, new)
			ch.clusterPolicy(old, new)
			c.countClusterPolicies(o.Metrics)
			c.status.changed(old, new)
		}
		if c.cnps, err = newReflector(o, watch.ClusterNetworkPolicies, onCNP, log); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// reportClusterPolicy logs, at each change of a ClusterNetworkPolicy,
// the parts of it this agent does not implement (they fail closed; the
// pods they select also get the compiler's warnings as Events).
func reportClusterPolicy(o Options, old, new *netpolicy.ClusterNetworkPolicy) {
	if new == nil || old != nil && netpolicy.ClusterPolicyChange(old, new) == nil {
		return
	}
	if parts := new.Unsupported(); len(parts) > 0 {
		o.Log.Warn("a ClusterNetworkPolicy holds what this agent does not implement: those rules fail closed (an Accept matches nothing, a Deny or Pass denies everything)",
			"clusterNetworkPolicy", new.Metadata.Name, "unsupported", strings.Join(parts, "; "))
	}
}

// countClusterPolicies sets the gauges of the ClusterNetworkPolicies by
// tier and of those with parts not implemented.
func (c *cache) countClusterPolicies(m *Metrics) {
	tiers := map[string]int{"Admin": 0, "Baseline": 0}
	unsupported := 0
	for _, p := range c.cnps.List() {
		if _, ok := tiers[p.Spec.Tier]; ok {
			tiers[p.Spec.Tier]++
		} else {
			tiers["other"]++ // a newer API's, enforced as Admin
		}
		if len(p.Unsupported()) > 0 {
			unsupported++
		}
	}
	for t, n := range tiers {
		m.clusterPolicies.WithLabelValues(t).Set(float64(n))
	}
	m.clusterUnsupported.Set(float64(unsupported))
}

// collections are the reflectors the cache runs: the five of
// NetworkPolicy, and the ClusterNetworkPolicies' when watched.
func (c *cache) collections() []interface {
	Run(context.Context)
	Synced() <-chan struct{}
	HasSynced() bool
	Err() error
	Kind() watch.Kind
	Retry()
} {
	out := []interface {
		Run(context.Context)
		Synced() <-chan struct{}
		HasSynced() bool
		Err() error
		Kind() watch.Kind
		Retry()
	}{c.policies, c.pods, c.namespaces, c.services, c.slices}
	if c.cnps != nil {
		out = append(out, c.cnps)
	}
	return out
}

// newReflector is the one place a collection's watch is made.
func newReflector[T any](o Options, k watch.Kind, onChange func(old, new *T), log *slog.Logger) (*watch.Informer[T], error) {
	return watch.New(watch.Options[T]{
		Config: o.Config, Kind: k, Log: log,
		OnChange: onChange,
		Backoff:  o.watchBackoff, MaxBackoff: 10 * o.watchBackoff,
	})
}

// run lists and watches every collection until ctx ends, and returns once
// every reflector has stopped.
func (c *cache) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range c.collections() {
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	if c.status != nil {
		wg.Add(1)
		go func() { defer wg.Done(); c.status.run(ctx) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Collections that list empty report no change: say when all
		// have listed, for the first pass.
		for _, r := range c.collections() {
			select {
			case <-r.Synced():
			case <-ctx.Done():
				return
			}
		}
		c.synced()
	}()
	wg.Wait()
}

// ready says why the cache cannot be trusted yet, or nil: nothing is
// compiled before every collection has listed once, since an empty cache
// of policies would open every pod.
func (c *cache) ready() error {
	var missing []string
	for _, r := range c.collections() {
		if r.HasSynced() {
			continue
		}
		s := r.Kind().String()
		if err := r.Err(); err != nil {
			s += " (" + err.Error() + ")"
		}
		missing = append(missing, s)
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the agent's caches have not synced with the API server yet: %s", strings.Join(missing, "; "))
}

// waitSynced waits until every collection has listed once, or wait passed.
func (c *cache) waitSynced(ctx context.Context, wait time.Duration) error {
	deadline := time.After(wait)
	for {
		err := c.ready()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// snapshot is the cache as the compiler reads it, but for the pods and
// namespaces: those it takes from indexes (netpolicy.NewIndexedCompiler),
// and a round looks a local pod up with pod.
func (c *cache) snapshot() *netpolicy.Snapshot {
	var cnps map[string]*netpolicy.ClusterNetworkPolicy
	if c.cnps != nil {
		cnps = c.cnps.List()
	}
	return &netpolicy.Snapshot{
		ClusterPolicies: cnps,
		Policies:        c.policies.List(),
		Services:        c.services.List(),
		EndpointSlices:  c.slices.List(),
	}
}

// pod is the cached pod of key ("namespace/name"); nil when the cache
// does not hold it.
func (c *cache) pod(key string) *netpolicy.Pod {
	p, _ := c.pods.Get(key)
	return p
}

// namespaceLabels are the cached labels of namespace ns; nil when it is
// not cached.
func (c *cache) namespaceLabels(ns string) map[string]string {
	if n, ok := c.namespaces.Get(ns); ok {
		return n.Metadata.Labels
	}
	return nil
}

// hasPod says whether the pod cache holds namespace/name.
func (c *cache) hasPod(namespace, name string) bool {
	_, ok := c.pods.Get(namespace + "/" + name)
	return ok
}

// podsErr is why the pods' watch last failed, nil while it works.
func (c *cache) podsErr() error { return c.pods.Err() }

// retry cuts every reflector's backoff short: the API server may be
// back while the watches wait out theirs (up to 30 s after an outage).
func (c *cache) retry() {
	for _, r := range c.collections() {
		r.Retry()
	}
}

// waitPod waits until the pod cache holds namespace/name, ctx ends or
// the wait is over.
func (c *cache) waitPod(ctx context.Context, namespace, name string, wait time.Duration) bool {
	deadline := time.After(wait)
	for {
		c.podMu.Lock()
		ch := c.podChanged
		c.podMu.Unlock()
		if c.hasPod(namespace, name) {
			return true
		}
		select {
		case <-ch:
		case <-deadline:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
