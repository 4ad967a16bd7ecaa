package policyctl

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/podevent"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// Options configure the policy controller.
type Options struct {
	// Config is the API server and credentials the watches (and, by
	// default, the Events) use. Required.
	Config *rest.Config
	// Store is the node's attachment state: the local pods. Required.
	Store state.Store
	// Node is this node's name, for Events. Empty: no Events.
	Node string
	// NodeAddrs gives the node's own addresses. Nil: the global unicast
	// addresses of the agent's network namespace (the node's: the agent
	// runs in the host network).
	NodeAddrs func() ([]netip.Addr, error)
	// Event posts an Event on a pod. Nil: a podevent.Client of Config.
	Event func(context.Context, podevent.Event) error
	// Debounce is how long a change waits at most for the ones that
	// follow it (a kubectl apply of many objects) before the pods are
	// compiled; a change followed by none for a fifth of it waits only
	// that. Zero: 50 ms.
	Debounce time.Duration
	// PushTimeout bounds one PUT /policy. Zero: 5 s.
	PushTimeout time.Duration
	// Retry is the first wait before a failed pod is tried again,
	// doubled up to 30 s. Zero: 1 s.
	Retry time.Duration
	// Parallel is how many stacks are pushed to at once. Zero: 32.
	Parallel int
	// Resync is how often every local pod is compiled, whatever
	// changed: a round compiles only the pods a change can affect, and
	// this is the net under that (a dependency the index would miss, a
	// policy file or stack changed behind the agent's back). A full
	// round costs what every change's round cost before the rounds were
	// incremental, so every 10 minutes it is noise beside them. Zero:
	// 10 minutes.
	Resync time.Duration
	// NodeCheck is how often the node's addresses are read to see if
	// they changed (they are in every pod's policy: the node is let in,
	// node ports are answered on them); no watch reports them. Zero:
	// 30 s.
	NodeCheck time.Duration
	// ClusterNetworkPolicy watches policy.networking.k8s.io
	// ClusterNetworkPolicies too and compiles them with the
	// NetworkPolicies into each pod's tiers. Where the API server does
	// not serve them (the CRD is not installed) the agent says so once
	// and enforces NetworkPolicy alone, looking for them again at every
	// relist. The agent reports on each one's status whether it
	// implements all of it (the netpolicy.ImplementedCondition).
	ClusterNetworkPolicy bool
	// Metrics count what the controller does. Nil: counted for nobody.
	Metrics *Metrics
	// Log receives the controller's lines. Nil: none.
	Log *slog.Logger
	// watchBackoff tunes the reflectors, for tests: zero means the
	// reflectors' defaults.
	watchBackoff time.Duration
	// compiled is told of each pod compiled, for tests; nil: nothing.
	compiled func(podKey string)
	// statusDelay is the most a ClusterNetworkPolicy's status write
	// waits, for tests; zero: statusDelay.
	statusDelay time.Duration
}

func (o *Options) validate() error {
	switch {
	case o.Config == nil:
		return errors.New("no API server configuration")
	}
	if o.NodeAddrs == nil {
		o.NodeAddrs = nodeAddrs
	}
	if o.Event == nil {
		events, err := podevent.New(o.Config)
		if err != nil {
			return err
		}
		o.Event = events.Post
	}
	if o.Debounce == 0 {
		o.Debounce = 50 * time.Millisecond
	}
	if o.PushTimeout == 0 {
		o.PushTimeout = 5 * time.Second
	}
	if o.Retry == 0 {
		o.Retry = time.Second
	}
	if o.Resync == 0 {
		o.Resync = 10 * time.Minute
	}
	if o.NodeCheck == 0 {
		o.NodeCheck = 30 * time.Second
	}
	if o.Parallel == 0 {
		o.Parallel = 32
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	return nil
}
