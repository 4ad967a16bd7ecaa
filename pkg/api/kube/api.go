package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// metadataOnly asks for a PartialObjectMetadata instead of the whole
// object (API servers since 1.20; older ones take the plain JSON offered
// second). A pod's spec and status are most of its bytes, and the plugin
// only wants the annotations, on the ADD path where every millisecond is
// paid per pod.
const metadataOnly = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"

type objectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	UID         string            `json:"uid,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func objectPath(prefix, namespace, resource, name string) string {
	p := prefix
	if namespace != "" {
		p += "/namespaces/" + url.PathEscape(namespace)
	}
	p += "/" + resource
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

func needNames(what string, names ...string) error {
	for _, n := range names {
		// An empty segment would turn a get of one object into a list of
		// all of them, which needs other permissions and means a bug.
		if n == "" {
			return fmt.Errorf("%s: empty name or namespace", what)
		}
	}
	return nil
}

// PodAnnotations returns a pod's annotations and UID (RBAC: get pods).
// The caller should compare the UID with the runtime's K8S_POD_UID: a
// different one means the name now belongs to another pod.
func (c *Client) PodAnnotations(ctx context.Context, namespace, name string) (map[string]string, string, error) {
	if err := needNames("get pods", namespace, name); err != nil {
		return nil, "", err
	}
	r := request{
		method: http.MethodGet, verb: "get", resource: "pods",
		namespace: namespace, name: name,
		path:   objectPath("/api/v1", namespace, "pods", name),
		accept: metadataOnly,
	}
	var obj struct {
		Metadata objectMeta `json:"metadata"`
	}
	if err := c.do(ctx, r, &obj); err != nil {
		return nil, "", err
	}
	if obj.Metadata.UID == "" {
		return nil, "", fmt.Errorf("%s: answer without metadata.uid", r)
	}
	ann := obj.Metadata.Annotations
	if ann == nil {
		ann = map[string]string{}
	}
	return ann, obj.Metadata.UID, nil
}

// Event types, as kubectl shows them.
const (
	EventNormal  = "Normal"
	EventWarning = "Warning"
)

// DefaultComponent is the event source when Event.Component is empty.
const DefaultComponent = "cni-usernet"

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
	// Type is EventNormal or EventWarning.
	Type string
	// Reason is a short UpperCamelCase word (at most 128 bytes) that
	// tools may match on.
	Reason string
	// Message is for people. It is cut to 1024 bytes: it may quote an
	// annotation's value, which a user can make arbitrarily long.
	Message string
	// Action is what was done (optional), e.g. "AddNetwork".
	Action string
	// Node is the node the event comes from (source.host and
	// reportingInstance). Required.
	Node string
	// Component is the event's source. Empty means DefaultComponent.
	Component string
	// Time is when it happened. Zero means now.
	Time time.Time
}

// Validate reports what the API server would refuse, and a missing UID.
func (e Event) Validate() error {
	switch {
	case e.Namespace == "" || e.PodName == "" || e.PodUID == "":
		return errors.New("event without the pod's namespace, name and UID")
	case e.Type != EventNormal && e.Type != EventWarning:
		return fmt.Errorf("event type %q: want %s or %s", e.Type, EventNormal, EventWarning)
	case e.Reason == "" || len(e.Reason) > maxReason:
		return fmt.Errorf("event reason %q: want 1 to %d bytes", e.Reason, maxReason)
	case e.Node == "":
		return errors.New("event without a node")
	}
	return nil
}

// eventJSON is the core/v1 Event body: only what we set.
type eventJSON struct {
	APIVersion         string      `json:"apiVersion"`
	Kind               string      `json:"kind"`
	Metadata           objectMeta  `json:"metadata"`
	InvolvedObject     objectRef   `json:"involvedObject"`
	Reason             string      `json:"reason"`
	Message            string      `json:"message"`
	Type               string      `json:"type"`
	Action             string      `json:"action,omitempty"`
	Count              int         `json:"count"`
	FirstTimestamp     string      `json:"firstTimestamp"`
	LastTimestamp      string      `json:"lastTimestamp"`
	Source             eventSource `json:"source"`
	ReportingComponent string      `json:"reportingComponent"`
	ReportingInstance  string      `json:"reportingInstance"`
}

type objectRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
}

type eventSource struct {
	Component string `json:"component"`
	Host      string `json:"host"`
}

// Event posts e (RBAC: create events in the pod's namespace). Events are
// best effort: callers should log a failure, not fail the pod for it.
func (c *Client) Event(ctx context.Context, e Event) error {
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
	r := request{
		method: http.MethodPost, verb: "create", resource: "events",
		namespace: e.Namespace,
		path:      objectPath("/api/v1", e.Namespace, "events", ""),
		body:      body,
	}
	return c.do(ctx, r, nil)
}

// Body is e as the core/v1 Event object to post at t: the plugin posts
// it with this package's client, the agent with client-go.
func (e Event) Body(t time.Time) ([]byte, error) {
	comp := e.Component
	if comp == "" {
		comp = DefaultComponent
	}
	// Without eventTime the API server validates this as a legacy
	// (core/v1) event, which is what kubectl describe and every
	// version's aggregation understand; timestamps are whole seconds.
	ts := t.UTC().Format(time.RFC3339)
	body, err := json.Marshal(eventJSON{
		APIVersion: "v1",
		Kind:       "Event",
		Metadata:   objectMeta{Name: eventName(e.PodName, t), Namespace: e.Namespace},
		InvolvedObject: objectRef{
			APIVersion: "v1", Kind: "Pod",
			Namespace: e.Namespace, Name: e.PodName, UID: e.PodUID,
		},
		Reason:             e.Reason,
		Message:            truncate(e.Message, maxMessage),
		Type:               e.Type,
		Action:             e.Action,
		Count:              1,
		FirstTimestamp:     ts,
		LastTimestamp:      ts,
		Source:             eventSource{Component: comp, Host: e.Node},
		ReportingComponent: comp,
		ReportingInstance:  truncate(e.Node, maxInstance),
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the event: %w", err)
	}
	return body, nil
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
