package policyctl

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/agent/podevent"
)

// reporter tells what the controller does: log lines, Events on the
// pods, metrics.
type reporter struct {
	log     *slog.Logger
	metrics *Metrics
	// node is this node's name; empty: no Events.
	node  string
	event func(context.Context, podevent.Event) error
}

// failures is one pod's run of consecutive failed pushes.
type failures struct {
	count int
	// told is when the last log line and Event about them went out.
	told time.Time
}

// tellEvery bounds the log lines and Events about one pod's failures.
const tellEvery = 5 * time.Minute

// pushFailed counts a failed push to t's stack and tells of it, at most
// once per tellEvery, in the log and as an Event on the pod (uid).
func (r *reporter) pushFailed(ctx context.Context, f *failures, t target, uid string, err error) {
	r.metrics.pushErrors.Inc()
	f.count++
	if !f.told.IsZero() && time.Since(f.told) < tellEvery {
		return
	}
	f.told = time.Now()
	r.log.Error("cannot apply the pod's network policy; its stack keeps the last one it holds; retrying",
		"pod", t.podKey(), "failures", f.count, "err", err)
	if r.node == "" || uid == "" {
		return
	}
	ectx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := r.event(ectx, podevent.Event{
		Namespace: t.namespace, PodName: t.pod, PodUID: uid,
		Type: corev1.EventTypeWarning, Reason: "NetworkPolicyNotApplied",
		Message: fmt.Sprintf("the pod's stack does not hold its current network policy (it keeps the last one it holds); retrying: %v", err),
		Action:  "ApplyNetworkPolicy", Node: r.node,
	}); err != nil {
		r.log.Warn("posting an event", "pod", t.podKey(), "err", err)
	}
}

// applied ends t's run of failures, if any: its stack holds its policy.
func (r *reporter) applied(f *failures, t target) {
	if f.count > 0 {
		r.log.Info("policy applied after failures", "pod", t.podKey(), "failures", f.count)
	}
	f.count = 0
}

// passResult is what one round did.
type passResult struct {
	// pods are the local pods; compiled those the round compiled (every
	// one when full); applied those of them whose stack holds their
	// policy (pushed of them: by a push of this round), failed those
	// whose stack could not be brought in step; inStep the local pods'
	// stacks that hold their policy after the round.
	pods, compiled, applied, pushed, failed, inStep int
	full                                            bool
	took                                            time.Duration
	// changed is when the first change the round covers arrived (zero:
	// the round answers no change), start when the round began;
	// lastPush is how long after start its last push ended.
	changed, start time.Time
	lastPush       time.Duration
	// cost sums where the round's workers spent their time.
	cost podCost
}

// podCost is where the time of one pod's compile and push went.
type podCost struct {
	// lock is the wait for the pod's state (an ADD's push holding it);
	// compile the compilation; file the policy file's write; put the
	// PUT to the stack, its answer included.
	lock, compile, file, put time.Duration
}

func (c *podCost) add(o podCost) {
	c.lock += o.lock
	c.compile += o.compile
	c.file += o.file
	c.put += o.put
}

// pass records a round.
func (r *reporter) pass(p passResult) {
	r.metrics.pods.Set(float64(p.inStep))
	r.metrics.pending.Set(float64(p.failed))
	if p.pushed > 0 || p.failed > 0 {
		r.metrics.duration.WithLabelValues("change").Observe(p.took.Seconds())
		// The timings split a change's propagation: how long the change
		// waited for the round (the debounce, a round in progress), then
		// the workers' time summed over the pods by what it went to.
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		attrs := []any{"pods", p.pods, "compiled", p.compiled, "full", p.full,
			"pushed", p.pushed, "failed", p.failed, "took", p.took.Round(time.Microsecond).String(),
			"tookMs", ms(p.took), "lastPushMs", ms(p.lastPush),
			"compileMs", ms(p.cost.compile), "fileMs", ms(p.cost.file), "putMs", ms(p.cost.put), "lockMs", ms(p.cost.lock)}
		if !p.changed.IsZero() {
			attrs = append(attrs, "changeSeen", p.changed, "waitedMs", ms(p.start.Sub(p.changed)))
		}
		r.log.Info("policies pushed", attrs...)
	}
}

// added records the policy of a new pod (its ADD) brought in step.
func (r *reporter) added(took time.Duration) {
	r.metrics.duration.WithLabelValues("add").Observe(took.Seconds())
}

// compileWarnings tells that parts of the policies selecting pod were
// skipped (what they would allow stays closed): in the log, and as an
// Event on the pod, posted in the background (best effort).
func (r *reporter) compileWarnings(pod *netpolicy.Pod, warnings string) {
	key := pod.Metadata.Namespace + "/" + pod.Metadata.Name
	r.log.Warn("parts of the network policies selecting the pod were skipped (what they would allow stays closed)", "pod", key, "warnings", warnings)
	if r.node == "" || pod.Metadata.UID == "" {
		return
	}
	e := podevent.Event{
		Namespace: pod.Metadata.Namespace, PodName: pod.Metadata.Name, PodUID: pod.Metadata.UID,
		Type: corev1.EventTypeWarning, Reason: "NetworkPolicySkipped",
		Message: "parts of the network policies selecting this pod were skipped; what they would allow stays closed: " + warnings,
		Action:  "CompileNetworkPolicy", Node: r.node,
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.event(ctx, e); err != nil {
			r.log.Warn("posting an event", "pod", key, "err", err)
		}
	}()
}
