// Package podevent posts the node agent's Events on pods through
// client-go. It is a package of its own because the agent and its policy
// controller both post them, and the controller does not import the
// agent. The Event itself, its checks and its body, is pkg/api/kube's:
// the plugin posts the same Events through that package, since it must
// not link client-go.
package podevent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
)

// schemeGroupVersion is the group the Events are posted to.
var schemeGroupVersion = corev1.SchemeGroupVersion

// Event is a core/v1 Event about a pod (kube.Event).
type Event = kube.Event

// Client posts Events (RBAC: create events in the pod's namespace).
type Client struct {
	core *rest.RESTClient
}

// New is a client for the server and credentials of cfg.
func New(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &schemeGroupVersion
	c.APIPath = "/api"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()
	// The callers bound their Events (one per pod per failure run or
	// compile warning); a client-side limit would only make the late
	// ones miss their deadline.
	c.QPS = -1
	core, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server for Events: %w", err)
	}
	return &Client{core: core}, nil
}

// Post posts e. Events are best effort: callers should log a failure, not
// fail for it.
func (c *Client) Post(ctx context.Context, e Event) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("posting an event: %w", err)
	}
	t := e.Time
	if t.IsZero() {
		t = time.Now()
	}
	body, err := e.Body(t)
	if err != nil {
		return err
	}
	err = c.core.Post().Namespace(e.Namespace).Resource("events").
		SetHeader("Content-Type", runtime.ContentTypeJSON).Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("posting event %s on pod %s/%s: %w", e.Reason, e.Namespace, e.PodName, err)
	}
	return nil
}
