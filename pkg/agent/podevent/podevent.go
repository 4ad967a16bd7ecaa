// Package podevent posts the node agent's Events on pods through
// client-go. It is its own package because the agent and its policy
// controller both post them, built one way, and the controller does not
// import the agent. (The plugin posts the same Events through pkg/api/kube,
// since it must not link client-go.)
package podevent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
)

// Component is the Events' source, the plugin's as well.
const Component = "cni-usernet"

// Limits the API server enforces on events (or, for the message, that
// events.k8s.io enforces and kubectl's columns assume).
const (
	maxReason   = 128
	maxInstance = 128
	maxMessage  = 1024
)

// Event is a core/v1 Event about a pod, shown by `kubectl describe pod`.
type Event struct {
	// Namespace, PodName and PodUID identify the pod. The UID is
	// required: kubectl describe selects the pod's events by it.
	Namespace, PodName, PodUID string
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason is a short UpperCamelCase word (at most 128 bytes) that
	// tools may match on.
	Reason string
	// Message is for people. It is cut to 1024 bytes: it may quote an
	// annotation's value or an error, which can be arbitrarily long.
	Message string
	// Action is what was done (optional), e.g. "RestartStack".
	Action string
	// Node is the node the event comes from (source.host and
	// reportingInstance). Required.
	Node string
	// Time is when it happened. Zero means now.
	Time time.Time
}

// Validate reports what the API server would refuse, and a missing UID.
func (e Event) Validate() error {
	switch {
	case e.Namespace == "" || e.PodName == "" || e.PodUID == "":
		return errors.New("event without the pod's namespace, name and UID")
	case e.Type != corev1.EventTypeNormal && e.Type != corev1.EventTypeWarning:
		return fmt.Errorf("event type %q: want %s or %s", e.Type, corev1.EventTypeNormal, corev1.EventTypeWarning)
	case e.Reason == "" || len(e.Reason) > maxReason:
		return fmt.Errorf("event reason %q: want 1 to %d bytes", e.Reason, maxReason)
	case e.Node == "":
		return errors.New("event without a node")
	}
	return nil
}

// object is e as the API object posted at t.
func (e Event) object(t time.Time) *corev1.Event {
	// Without eventTime the API server validates this as a legacy
	// (core/v1) event, which is what kubectl describe and every
	// version's aggregation understand; timestamps are whole seconds.
	ts := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &corev1.Event{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta: metav1.ObjectMeta{Name: eventName(e.PodName, t), Namespace: e.Namespace},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod",
			Namespace: e.Namespace, Name: e.PodName, UID: types.UID(e.PodUID),
		},
		Reason:              e.Reason,
		Message:             truncate(e.Message, maxMessage),
		Type:                e.Type,
		Action:              e.Action,
		Count:               1,
		FirstTimestamp:      ts,
		LastTimestamp:       ts,
		Source:              corev1.EventSource{Component: Component, Host: e.Node},
		ReportingController: Component,
		ReportingInstance:   truncate(e.Node, maxInstance),
	}
}

// Client posts Events (RBAC: create events in the pod's namespace).
type Client struct {
	core *rest.RESTClient
}

// scheme is the one group posted to.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
}

// New is a client for the server and credentials of cfg.
func New(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = codecs.WithoutConversion()
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
	err := c.core.Post().Namespace(e.Namespace).Resource("events").Body(e.object(t)).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("posting event %s on pod %s/%s: %w", e.Reason, e.Namespace, e.PodName, err)
	}
	return nil
}

// eventName follows client-go's recorder, pod name then the time in hex,
// so names are unique and sort by time; a pod name near the 253-byte limit
// is shortened to keep the result a valid DNS subdomain.
func eventName(pod string, t time.Time) string {
	suffix := fmt.Sprintf(".%x", t.UnixNano())
	if max := 253 - len(suffix); len(pod) > max {
		pod = strings.TrimRight(pod[:max], "-.")
	}
	return pod + suffix
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
