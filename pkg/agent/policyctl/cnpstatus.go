// SPDX-License-Identifier: Apache-2.0

package policyctl

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/agent/watch"
)

// The condition's reasons, and the field manager of its writes.
const (
	reasonImplemented    = "Implemented"
	reasonNotImplemented = "NotImplemented"
	statusFieldManager   = "cni-usernet"
)

// Bounds of the status writes.
const (
	// statusDelay is the most a write waits, drawn at random: every
	// node's agent computes the same condition, and the wait lets the
	// first one's write reach the others' caches before they write.
	statusDelay = 5 * time.Second
	// statusRetry is the first wait after a failed write, doubled up to
	// statusMaxRetry.
	statusRetry    = time.Second
	statusMaxRetry = 5 * time.Minute
	// rewriteAfter is the first wait before this agent writes a
	// generation's condition a second time, doubled at each further
	// write up to maxRewriteAfter: a condition that is overwritten with
	// another for the same spec is an agent of another version (a
	// rolling upgrade), and the two must not answer each other's writes
	// without pause.
	rewriteAfter    = 30 * time.Second
	maxRewriteAfter = 10 * time.Minute
	// maxMessage bounds the parts a message names (the API takes 32 KiB).
	maxMessage = 2048
)

// statusWriter reports on each ClusterNetworkPolicy's status whether this
// agent implements all of it: the netpolicy.ImplementedCondition,
// written with server-side apply under statusFieldManager, so that the
// conditions of other implementations stay. Every node's agent sees the
// same object and computes the same condition, so a write is made only
// when the object's condition differs from the one computed, after a
// random wait and a second look at the cache. It runs beside the rounds,
// never in them; at most one write per policy is pending.
type statusWriter struct {
	log    *slog.Logger
	client *rest.RESTClient
	// get is the policy of a name as the cache holds it now.
	get func(name string) (*netpolicy.ClusterNetworkPolicy, bool)
	// delay is the most a write waits; zero: statusDelay.
	delay time.Duration

	wake chan struct{}

	mu sync.Mutex // guards the fields below
	// due are the policies to look at again, by name, and when.
	due map[string]time.Time
	// backoff is the wait after a policy's last failed write.
	backoff map[string]time.Duration
	// written is, by policy, the generation this agent last wrote and
	// when it may write that generation again.
	written map[string]rewrite
	// forbidden is set at the first 403: the ClusterRole lacks the
	// rule, and nothing is written until the agent restarts.
	forbidden bool
}

type rewrite struct {
	generation int64
	wait       time.Duration
	next       time.Time
}

func newStatusWriter(cfg *rest.Config, log *slog.Logger, delay time.Duration,
	get func(string) (*netpolicy.ClusterNetworkPolicy, bool)) (*statusWriter, error) {
	k := watch.ClusterNetworkPolicies
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &schema.GroupVersion{Group: k.Group, Version: k.Version}
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()
	client, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server for the ClusterNetworkPolicies' status: %w", err)
	}
	if delay == 0 {
		delay = statusDelay
	}
	return &statusWriter{log: log, client: client, get: get, delay: delay, wake: make(chan struct{}, 1),
		due: map[string]time.Time{}, backoff: map[string]time.Duration{}, written: map[string]rewrite{}}, nil
}

// changed is told of every change of a ClusterNetworkPolicy (old nil:
// added, new nil: deleted), from the watch's goroutine: it does not
// block.
func (w *statusWriter) changed(old, new *netpolicy.ClusterNetworkPolicy) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if new == nil {
		delete(w.due, old.Metadata.Name)
		delete(w.backoff, old.Metadata.Name)
		delete(w.written, old.Metadata.Name)
		return
	}
	name := new.Metadata.Name
	if _, pending := w.due[name]; pending || w.forbidden || sameCondition(new.Implemented, implemented(new, time.Now())) {
		return
	}
	w.due[name] = time.Now().Add(rand.N(w.delay + 1))
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run writes the conditions due until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		var next time.Time
		for _, t := range w.due {
			if next.IsZero() || t.Before(next) {
				next = t
			}
		}
		w.mu.Unlock()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(0, time.Until(next))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
			timer.Stop()
			continue
		case <-timer.C:
		}
		w.mu.Lock()
		var names []string
		now := time.Now()
		for name, t := range w.due {
			if !t.After(now) {
				names = append(names, name)
				delete(w.due, name)
			}
		}
		w.mu.Unlock()
		for _, name := range names {
			w.write(ctx, name)
		}
	}
}

// write looks at the cached policy of name again and, if its condition
// still differs from the one computed, writes it.
func (w *statusWriter) write(ctx context.Context, name string) {
	p, ok := w.get(name)
	if !ok {
		return // deleted meanwhile
	}
	now := time.Now()
	cond := implemented(p, now)
	if sameCondition(p.Implemented, cond) {
		return // another agent's write came first
	}
	w.mu.Lock()
	if w.forbidden {
		w.mu.Unlock()
		return
	}
	if r := w.written[name]; r.generation == p.Generation && now.Before(r.next) {
		w.due[name] = r.next
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()

	err := w.patch(ctx, name, cond)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		delete(w.backoff, name)
		r := w.written[name]
		if r.generation != p.Generation || r.wait == 0 {
			r = rewrite{generation: p.Generation, wait: rewriteAfter}
		} else {
			r.wait = min(2*r.wait, maxRewriteAfter)
		}
		r.next = time.Now().Add(r.wait)
		w.written[name] = r
	case apierrors.IsForbidden(err):
		w.forbidden = true
		clear(w.due)
		w.log.Warn("the agent may not write the status of ClusterNetworkPolicies (its ClusterRole lacks patch on clusternetworkpolicies/status, as an older chart's): their "+
			netpolicy.ImplementedCondition+" condition is not reported until the agent restarts", "clusterNetworkPolicy", name, "err", err)
	case apierrors.IsNotFound(err), ctx.Err() != nil:
		// Deleted meanwhile, or the agent is stopping.
	default:
		b := min(2*w.backoff[name], statusMaxRetry)
		if b == 0 {
			b = statusRetry
		}
		w.backoff[name] = b
		w.due[name] = time.Now().Add(b)
		w.log.Warn("writing a ClusterNetworkPolicy's status condition; retrying", "clusterNetworkPolicy", name, "retryIn", b, "err", err)
	}
}

// patch applies cond as the object's one condition of this field
// manager: the other managers' conditions are not in the patch, so they
// stay.
func (w *statusWriter) patch(ctx context.Context, name string, cond netpolicy.ClusterPolicyCondition) error {
	k := watch.ClusterNetworkPolicies
	body, err := json.Marshal(map[string]any{
		"apiVersion": k.Group + "/" + k.Version,
		"kind":       "ClusterNetworkPolicy",
		"metadata":   map[string]any{"name": name},
		"status": map[string]any{"conditions": []metav1.Condition{{
			Type: netpolicy.ImplementedCondition, Status: metav1.ConditionStatus(cond.Status),
			ObservedGeneration: cond.ObservedGeneration, LastTransitionTime: metav1.NewTime(cond.LastTransitionTime),
			Reason: cond.Reason, Message: cond.Message,
		}}},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// JSON is YAML: the apply patch's type names YAML, and takes both.
	err = w.client.Patch(types.ApplyYAMLPatchType).Resource(k.Resource).Name(name).SubResource("status").
		Param("fieldManager", statusFieldManager).Param("force", "true").Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("applying the %s condition of ClusterNetworkPolicy %s: %w", netpolicy.ImplementedCondition, name, err)
	}
	return nil
}

// implemented is the condition p's status should hold: True when the
// agent implements every part of p, False naming the parts it does not.
// Its transition time is the one p holds while the status stays, now
// when it changes.
func implemented(p *netpolicy.ClusterNetworkPolicy, now time.Time) netpolicy.ClusterPolicyCondition {
	c := netpolicy.ClusterPolicyCondition{Status: string(metav1.ConditionTrue), Reason: reasonImplemented,
		Message: "cni-usernet implements every part of this policy", ObservedGeneration: p.Generation}
	if parts := p.Unsupported(); len(parts) > 0 {
		c.Status, c.Reason = string(metav1.ConditionFalse), reasonNotImplemented
		c.Message = "cni-usernet does not implement " + joinBounded(parts, maxMessage) +
			": the rules that hold them fail closed (an Accept there matches nothing, a Deny or Pass denies everything)"
	}
	c.LastTransitionTime = now.UTC().Truncate(time.Second)
	if p.Implemented != nil && p.Implemented.Status == c.Status {
		c.LastTransitionTime = p.Implemented.LastTransitionTime
	}
	return c
}

// sameCondition says whether the condition an object holds is want, but
// for its transition time (which agents set each at its own clock).
func sameCondition(have *netpolicy.ClusterPolicyCondition, want netpolicy.ClusterPolicyCondition) bool {
	return have != nil && have.Status == want.Status && have.Reason == want.Reason &&
		have.Message == want.Message && have.ObservedGeneration == want.ObservedGeneration
}

// joinBounded joins parts with "; ", those past n bytes counted instead.
func joinBounded(parts []string, n int) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 && b.Len()+len(p) > n {
			fmt.Fprintf(&b, "; and %d more", len(parts)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p)
	}
	return b.String()
}
