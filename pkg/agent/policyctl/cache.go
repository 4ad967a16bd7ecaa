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
	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
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

	// podChanged wakes the callers waiting for a pod (waitPod): closed
	// and made anew at each change of the pods.
	podMu      sync.Mutex
	podChanged chan struct{}
}

// newCache makes the reflectors; changed is called on every change of
// any collection.
func newCache(o Options, changed func()) (*cache, error) {
	c := &cache{podChanged: make(chan struct{})}
	var err error
	log := o.Log.With("component", "policy-watch")
	onPod := func() {
		changed()
		c.podMu.Lock()
		close(c.podChanged)
		c.podChanged = make(chan struct{})
		c.podMu.Unlock()
	}
	if c.policies, err = newReflector(o, kube.NetworkPolicies, func(p *netpolicy.NetworkPolicy) kube.Meta { return meta(&p.Metadata) }, changed, log); err != nil {
		return nil, err
	}
	if c.pods, err = newReflector(o, kube.Pods, func(p *netpolicy.Pod) kube.Meta { return meta(&p.Metadata) }, onPod, log); err != nil {
		return nil, err
	}
	if c.namespaces, err = newReflector(o, kube.Namespaces, func(p *netpolicy.Namespace) kube.Meta { return meta(&p.Metadata) }, changed, log); err != nil {
		return nil, err
	}
	if c.services, err = newReflector(o, kube.Services, func(p *netpolicy.Service) kube.Meta { return meta(&p.Metadata) }, changed, log); err != nil {
		return nil, err
	}
	if c.slices, err = newReflector(o, kube.EndpointSlices, func(p *netpolicy.EndpointSlice) kube.Meta { return meta(&p.Metadata) }, changed, log); err != nil {
		return nil, err
	}
	return c, nil
}

func newReflector[T any](o Options, k kube.Kind, _ func(*T) kube.Meta, onChange func(), log *slog.Logger) (*watch.Informer[T], error) {
	return watch.New(watch.Options[T]{
		Config: watch.RESTConfig(o.Client.Config()), Kind: k, Log: log,
		OnChange: func(_, _ *T) { onChange() },
		Backoff:  o.watchBackoff, MaxBackoff: 10 * o.watchBackoff,
	})
}

func meta(m *netpolicy.ObjectMeta) kube.Meta {
	return kube.Meta{Namespace: m.Namespace, Name: m.Name, ResourceVersion: m.ResourceVersion}
}

// run lists and watches every collection until ctx ends, and returns once
// every reflector has stopped.
func (c *cache) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, run := range []func(context.Context){c.policies.Run, c.pods.Run, c.namespaces.Run, c.services.Run, c.slices.Run} {
		wg.Add(1)
		go func() { defer wg.Done(); run(ctx) }()
	}
	wg.Wait()
}

// synced says why the cache cannot be trusted yet, or nil: nothing is
// compiled before every collection has listed once, since an empty cache
// of policies would open every pod.
func (c *cache) synced() error {
	var missing []string
	for _, r := range []interface {
		HasSynced() bool
		Err() error
		Kind() kube.Kind
	}{c.policies, c.pods, c.namespaces, c.services, c.slices} {
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
		err := c.synced()
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

// snapshot is the cache as the compiler reads it.
func (c *cache) snapshot() *netpolicy.Snapshot {
	return &netpolicy.Snapshot{
		Policies:       c.policies.List(),
		Pods:           c.pods.List(),
		Namespaces:     c.namespaces.List(),
		Services:       c.services.List(),
		EndpointSlices: c.slices.List(),
	}
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
	c.pods.Retry()
	c.policies.Retry()
	c.namespaces.Retry()
	c.services.Retry()
	c.slices.Retry()
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
