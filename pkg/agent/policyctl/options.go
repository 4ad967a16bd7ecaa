package policyctl

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// Options configure the policy controller.
type Options struct {
	// Client watches the API server. Required.
	Client *kube.Client
	// Store is the node's attachment state: the local pods. Required.
	Store state.Store
	// Node is this node's name, for Events. Empty: no Events.
	Node string
	// NodeAddrs gives the node's own addresses. Nil: the global unicast
	// addresses of the agent's network namespace (the node's: the agent
	// runs in the host network).
	NodeAddrs func() ([]netip.Addr, error)
	// Event posts an Event on a pod. Nil: Client.Event.
	Event func(context.Context, kube.Event) error
	// Debounce is how long a change waits for the ones that follow it
	// (a kubectl apply of many objects) before the pods are compiled.
	// Zero: 50 ms.
	Debounce time.Duration
	// PushTimeout bounds one PUT /policy. Zero: 5 s.
	PushTimeout time.Duration
	// Retry is the first wait before a failed pod is tried again,
	// doubled up to 30 s. Zero: 1 s.
	Retry time.Duration
	// Parallel is how many stacks are pushed to at once. Zero: 8.
	Parallel int
	// Metrics count what the controller does. Nil: counted for nobody.
	Metrics *Metrics
	// Log receives the controller's lines. Nil: none.
	Log *slog.Logger
	// watchBackoff tunes the reflectors, for tests: zero means the
	// reflectors' defaults.
	watchBackoff time.Duration
}

func (o *Options) validate() error {
	switch {
	case o.Client == nil:
		return errors.New("no API client")
	}
	if o.NodeAddrs == nil {
		o.NodeAddrs = nodeAddrs
	}
	if o.Event == nil {
		o.Event = o.Client.Event
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
	if o.Parallel == 0 {
		o.Parallel = 8
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	return nil
}
