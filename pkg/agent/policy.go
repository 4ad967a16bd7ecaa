package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// CompileFunc prepares the compilation of local pods against one snapshot
// (netpolicy.NewCompiler: the work shared between the pods is done once)
// and returns the function that compiles one of them, given the node's
// addresses. local are every local pod, so that one the API shows no
// address for yet (during its ADD) is already a peer of the others.
type CompileFunc func(snap *netpolicy.Snapshot, local []netpolicy.LocalPod) func(pod netpolicy.LocalPod, node []netip.Addr) *policy.PodPolicy

// policyOptions configure the policy controller.
type policyOptions struct {
	// Client watches the API server. Required.
	Client *kube.Client
	// Store is the node's attachment state: the local pods. Required.
	Store state.Store
	// Compile compiles one pod's policy. Required.
	Compile CompileFunc
	// Node is this node's name, for Events. Required for Events.
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
	// Metrics, when set, count what the controller does.
	Metrics *policyMetrics
	Log     *slog.Logger
	// reflector tuning, for tests: zero means the reflectors' defaults.
	watchBackoff time.Duration
}

func (o *policyOptions) validate() error {
	switch {
	case o.Client == nil:
		return errors.New("no API client")
	case o.Compile == nil:
		return errors.New("no compiler")
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
		o.Metrics = newPolicyMetrics()
	}
	return nil
}

// policyController keeps every local pod's stack holding the pod's
// current policy: the watches feed a snapshot of the cluster; on any
// change each local pod is compiled again, and a policy that changed is
// written to the pod's policy file, then pushed to its stack.
//
// The file comes first so that a stack the supervisor restarts comes back
// with the latest policy, and so that an agent killed between the two
// finds, once restarted, what it had decided: its first pass pushes every
// pod, whatever it believes the stack holds. Nothing is compiled before
// every watch has listed once: an empty cache of policies would open every
// pod. While the API server is away the caches keep their last view, so
// the stacks keep what they hold.
type policyController struct {
	o policyOptions

	policies   *kube.Reflector[netpolicy.NetworkPolicy]
	pods       *kube.Reflector[netpolicy.Pod]
	namespaces *kube.Reflector[netpolicy.Namespace]
	services   *kube.Reflector[netpolicy.Service]
	slices     *kube.Reflector[netpolicy.EndpointSlice]

	// kick asks for a pass; one pending kick is enough.
	kick chan struct{}
	// podChanged wakes the agent socket's requests waiting for a pod.
	podMu      sync.Mutex
	podChanged chan struct{}

	mu sync.Mutex // guards gen and stacks
	// gen is the last generation handed out.
	gen    uint64
	stacks map[string]*podState // by attachment key
}

// podState is what the controller knows of one attachment's stack.
type podState struct {
	// mu serializes compiling and pushing for the pod, so that its
	// pushes go out in the order of their generations.
	mu sync.Mutex
	// applied is what the stack holds; nil: not known (this agent has
	// not pushed to it yet).
	applied *policy.PodPolicy
	// failures counts consecutive failed pushes; failed is the first of
	// them, told at when the last log line and Event about it went out.
	failures int
	told     time.Time
	lastErr  error
}

// Generations start from the time in microseconds, or past the largest in
// the policy files when that is larger: a restarted agent continues above
// what any stack may hold, even with its files lost (a clock set back
// while the files are lost is the one case that breaks this).
func startGeneration(fileMax uint64, now time.Time) uint64 {
	return max(fileMax, uint64(now.UnixMicro()))
}

func newPolicyController(o policyOptions) (*policyController, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("starting the policy controller: %w", err)
	}
	c := &policyController{
		o:          o,
		kick:       make(chan struct{}, 1),
		podChanged: make(chan struct{}),
		stacks:     map[string]*podState{},
	}
	onChange := func() { c.trigger() }
	var err error
	log := o.Log.With("component", "policy-watch")
	if c.policies, err = newReflector(o, kube.NetworkPolicies, func(p *netpolicy.NetworkPolicy) kube.Meta { return meta(&p.Metadata) }, onChange, log); err != nil {
		return nil, err
	}
	onPod := func() {
		c.trigger()
		c.podMu.Lock()
		close(c.podChanged)
		c.podChanged = make(chan struct{})
		c.podMu.Unlock()
	}
	if c.pods, err = newReflector(o, kube.Pods, func(p *netpolicy.Pod) kube.Meta { return meta(&p.Metadata) }, onPod, log); err != nil {
		return nil, err
	}
	if c.namespaces, err = newReflector(o, kube.Namespaces, func(p *netpolicy.Namespace) kube.Meta { return meta(&p.Metadata) }, onChange, log); err != nil {
		return nil, err
	}
	if c.services, err = newReflector(o, kube.Services, func(p *netpolicy.Service) kube.Meta { return meta(&p.Metadata) }, onChange, log); err != nil {
		return nil, err
	}
	if c.slices, err = newReflector(o, kube.EndpointSlices, func(p *netpolicy.EndpointSlice) kube.Meta { return meta(&p.Metadata) }, onChange, log); err != nil {
		return nil, err
	}
	var fileMax uint64
	atts, _ := o.Store.List()
	for _, a := range atts {
		if p, err := readPolicyFile(policyPath(a)); err == nil {
			fileMax = max(fileMax, p.Generation)
		}
	}
	c.gen = startGeneration(fileMax, time.Now())
	return c, nil
}

func newReflector[T any](o policyOptions, k kube.Kind, m func(*T) kube.Meta, onChange func(), log *slog.Logger) (*kube.Reflector[T], error) {
	return kube.NewReflector(kube.ReflectorOptions[T]{
		Client: o.Client, Kind: k, Meta: m, OnChange: onChange, Log: log,
		Backoff: o.watchBackoff, MaxBackoff: 10 * o.watchBackoff,
	})
}

func meta(m *netpolicy.ObjectMeta) kube.Meta {
	return kube.Meta{Namespace: m.Namespace, Name: m.Name, ResourceVersion: m.ResourceVersion}
}

// policyPath is the attachment's policy file: the one its record names,
// or for a record that names none, the file beside its stack's
// configuration (docs/policy.md: <attachment dir>/policy.json).
func policyPath(a *state.Attachment) string {
	if a.PolicyPath != "" {
		return a.PolicyPath
	}
	if a.ConfigPath == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(a.ConfigPath), "policy.json")
}

func readPolicyFile(path string) (*policy.PodPolicy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return policy.Unmarshal(b)
}

func (c *policyController) trigger() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// synced says why the caches cannot be trusted yet, or nil.
func (c *policyController) synced() error {
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

func (c *policyController) snapshot() *netpolicy.Snapshot {
	return &netpolicy.Snapshot{
		Policies:       c.policies.List(),
		Pods:           c.pods.List(),
		Namespaces:     c.namespaces.List(),
		Services:       c.services.List(),
		EndpointSlices: c.slices.List(),
	}
}

// Run watches and keeps the stacks in step until ctx ends.
func (c *policyController) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, run := range []func(context.Context){c.policies.Run, c.pods.Run, c.namespaces.Run, c.services.Run, c.slices.Run} {
		wg.Add(1)
		go func() { defer wg.Done(); run(ctx) }()
	}
	defer wg.Wait()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	backoff := c.o.Retry
	said := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-retry.C:
		}
		// Let the changes that come with this one arrive: a kubectl
		// apply of a file of policies is many events within milliseconds.
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.o.Debounce):
		}
		select {
		case <-c.kick:
		default:
		}
		if err := c.synced(); err != nil {
			if !said {
				c.o.Log.Info("waiting for the caches before compiling", "why", err)
				said = true
			}
			continue
		}
		if failed := c.syncAll(ctx); failed > 0 {
			retry.Reset(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = c.o.Retry
		}
	}
}

// target is where one attachment's policy goes.
type target struct {
	key            string // attachment key (state.Key)
	namespace, pod string
	ips            []netip.Addr
	socket, file   string
}

func targetOf(a *state.Attachment) (target, error) {
	t := target{
		key: state.Key(a.ContainerID, a.IfName), namespace: a.PodNS, pod: a.PodName,
		socket: a.ControlSocket, file: policyPath(a),
	}
	for _, s := range a.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return t, fmt.Errorf("attachment %s/%s: address %q: %w", a.ContainerID, a.IfName, s, err)
		}
		t.ips = append(t.ips, p.Addr())
	}
	return t, nil
}

// syncAll compiles every local pod and pushes what changed; it returns
// how many pods could not be brought in step.
func (c *policyController) syncAll(ctx context.Context) int {
	start := time.Now()
	snap := c.snapshot()
	node, err := c.o.NodeAddrs()
	if err != nil {
		c.o.Log.Error("reading the node's addresses; compiling without them", "err", err)
	}
	atts, errs := c.o.Store.List()
	for _, err := range errs {
		c.o.Log.Warn("reading attachment state", "err", err)
	}
	var targets []target
	live := map[string]bool{}
	for _, a := range atts {
		if a.PodName == "" || a.ControlSocket == "" {
			continue // not a Kubernetes pod, or not started yet
		}
		t, err := targetOf(a)
		if err != nil {
			c.o.Log.Warn("skipping an attachment", "err", err)
			continue
		}
		targets = append(targets, t)
		live[t.key] = true
	}
	c.mu.Lock()
	for k := range c.stacks {
		if !live[k] {
			delete(c.stacks, k)
		}
	}
	c.mu.Unlock()

	var local []netpolicy.LocalPod
	for _, t := range targets {
		if pod := snap.Pods[t.namespace+"/"+t.pod]; pod != nil {
			local = append(local, netpolicy.LocalPod{Pod: pod, IPs: t.ips})
		}
	}
	compile := c.o.Compile(snap, local)
	var failed, pushed, applied, pending int
	var mu sync.Mutex
	work := make(chan target)
	var wg sync.WaitGroup
	for range min(c.o.Parallel, max(1, len(targets))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				did, _, err := c.syncPod(ctx, snap, compile, node, t)
				mu.Lock()
				switch {
				case errors.Is(err, errPodNotCached):
				case err != nil:
					failed++
					pending++
				default:
					applied++
					if did {
						pushed++
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, t := range targets {
		work <- t
	}
	close(work)
	wg.Wait()
	c.o.Metrics.pods.Set(float64(applied))
	c.o.Metrics.pending.Set(float64(pending))
	if pushed > 0 || failed > 0 {
		d := time.Since(start)
		c.o.Metrics.duration.WithLabelValues("change").Observe(d.Seconds())
		c.o.Log.Info("policies pushed", "pods", len(targets), "pushed", pushed, "failed", failed, "took", d.Round(time.Microsecond).String())
	}
	return failed
}

// errPodNotCached marks a local pod the pod cache does not hold (yet, or
// any more): its stack keeps what it has.
var errPodNotCached = errors.New("pod not in the agent's cache")

// syncPod compiles t's pod and, when its policy changed (or the stack's is
// not known), writes and pushes it. It returns whether it pushed and the
// generation the stack holds.
func (c *policyController) syncPod(ctx context.Context, snap *netpolicy.Snapshot, compile func(netpolicy.LocalPod, []netip.Addr) *policy.PodPolicy, node []netip.Addr, t target) (bool, uint64, error) {
	pod := snap.Pods[t.namespace+"/"+t.pod]
	if pod == nil {
		return false, 0, fmt.Errorf("%s/%s: %w", t.namespace, t.pod, errPodNotCached)
	}
	c.mu.Lock()
	ps := c.stacks[t.key]
	if ps == nil {
		ps = &podState{}
		c.stacks[t.key] = ps
	}
	c.mu.Unlock()
	ps.mu.Lock()
	defer ps.mu.Unlock()

	p := compile(netpolicy.LocalPod{Pod: pod, IPs: t.ips}, node)
	if ps.applied != nil && policy.Equal(ps.applied, p) {
		return false, ps.applied.Generation, nil
	}
	if ps.applied == nil {
		// This agent never pushed to the stack: the file holds what the
		// last agent decided, pushed or not (killed in between). The same
		// policy keeps its generation; the push goes out regardless.
		if old, err := readPolicyFile(t.file); err == nil && policy.Equal(old, p) {
			p.Generation = old.Generation
		}
	}
	if p.Generation == 0 {
		p.Generation = c.nextGeneration()
	}
	err := c.write(ctx, t, p)
	var stale *staleError
	if errors.As(err, &stale) {
		// The stack holds a newer generation than ours (its file was
		// lost, or the clock went back): continue above it.
		c.mu.Lock()
		c.gen = max(c.gen, stale.held)
		c.mu.Unlock()
		p.Generation = c.nextGeneration()
		err = c.write(ctx, t, p)
	}
	if err != nil {
		// What the stack holds is not known any more (the PUT may have
		// reached it), and the file holds p: the next pass pushes again.
		ps.applied = nil
		c.failed(ctx, ps, t, pod, err)
		return false, 0, err
	}
	if ps.failures > 0 {
		c.o.Log.Info("policy applied after failures", "pod", t.namespace+"/"+t.pod, "failures", ps.failures)
	}
	ps.applied, ps.failures, ps.lastErr = p, 0, nil
	return true, p.Generation, nil
}

func (c *policyController) nextGeneration() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	return c.gen
}

// staleError is a push the stack refused as older than what it holds.
type staleError struct{ held uint64 }

func (e *staleError) Error() string {
	return fmt.Sprintf("the stack holds a newer policy (generation %d)", e.held)
}

// write puts p in t's policy file, then in its stack.
func (c *policyController) write(ctx context.Context, t target, p *policy.PodPolicy) error {
	b, err := policy.Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding the policy: %w", err)
	}
	if t.file == "" {
		return errors.New("the attachment has no policy file path")
	}
	if err := atomicfile.Write(t.file, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", t.file, err)
	}
	gen, err := control.PutPolicy(t.socket, c.o.PushTimeout, p)
	var refused *control.RefusedError
	if errors.As(err, &refused) && refused.Status == http.StatusConflict {
		// Older than what the stack holds, or the stack enforces no
		// policy (started without networkPolicy): its status tells.
		var st control.Status
		if control.FetchStatus(t.socket, c.o.PushTimeout, &st) == nil && st.Policy != nil && st.Policy.Generation > p.Generation {
			return &staleError{held: st.Policy.Generation}
		}
	}
	if err != nil {
		return err
	}
	if gen != p.Generation {
		return fmt.Errorf("pushing generation %d: the stack answered %d", p.Generation, gen)
	}
	return nil
}

// tellEvery bounds the log lines and Events about one pod's failures.
const tellEvery = 5 * time.Minute

func (c *policyController) failed(ctx context.Context, ps *podState, t target, pod *netpolicy.Pod, err error) {
	c.o.Metrics.pushErrors.Inc()
	ps.failures++
	ps.lastErr = err
	if !ps.told.IsZero() && time.Since(ps.told) < tellEvery {
		return
	}
	ps.told = time.Now()
	c.o.Log.Error("cannot apply the pod's network policy; its stack keeps the last one it holds; retrying",
		"pod", t.namespace+"/"+t.pod, "failures", ps.failures, "err", err)
	if c.o.Node == "" || pod.Metadata.UID == "" {
		return
	}
	ectx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.o.Event(ectx, kube.Event{
		Namespace: t.namespace, PodName: t.pod, PodUID: pod.Metadata.UID,
		Type: kube.EventWarning, Reason: "NetworkPolicyNotApplied",
		Message: fmt.Sprintf("the pod's stack does not hold its current network policy (it keeps the last one it holds); retrying: %v", err),
		Action:  "ApplyNetworkPolicy", Node: c.o.Node,
	}); err != nil {
		c.o.Log.Warn("posting an event", "pod", t.namespace+"/"+t.pod, "err", err)
	}
}

// waitSynced waits until every cache has listed once, or wait passed.
func (c *policyController) waitSynced(ctx context.Context, wait time.Duration) error {
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

// waitPod waits until the pod cache holds namespace/name, ctx ends or
// the wait is over.
func (c *policyController) waitPod(ctx context.Context, namespace, name string, wait time.Duration) bool {
	deadline := time.After(wait)
	for {
		c.podMu.Lock()
		ch := c.podChanged
		c.podMu.Unlock()
		if _, ok := c.pods.Get(namespace + "/" + name); ok {
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

// applyNow compiles and pushes one pod on the plugin's request (ADD): it
// returns the generation its stack holds.
func (c *policyController) applyNow(ctx context.Context, t target, wait time.Duration) (uint64, error) {
	if err := c.synced(); err != nil {
		return 0, err
	}
	if _, ok := c.pods.Get(t.namespace + "/" + t.pod); !ok && c.pods.Err() != nil {
		// The API server may be back while the watches wait out their
		// backoff (up to 30 s after an outage): look now.
		c.pods.Retry()
		c.policies.Retry()
		c.namespaces.Retry()
		c.services.Retry()
		c.slices.Retry()
	}
	if !c.waitPod(ctx, t.namespace, t.pod, wait) {
		if err := c.pods.Err(); err != nil {
			// Fail closed: a pod the agent cannot look up may be selected
			// by any policy, and attaching it open would let in what its
			// policies deny. The runtime retries (code 11) until the API
			// server answers again.
			return 0, fmt.Errorf("pod %s/%s: %w after %s and the API server cannot be reached (%v): "+
				"its NetworkPolicy cannot be known, so it is not attached (fail closed; retried once the API server answers)",
				t.namespace, t.pod, errPodNotCached, wait, err)
		}
		return 0, fmt.Errorf("pod %s/%s: %w after %s", t.namespace, t.pod, errPodNotCached, wait)
	}
	start := time.Now()
	node, err := c.o.NodeAddrs()
	if err != nil {
		c.o.Log.Error("reading the node's addresses; compiling without them", "err", err)
	}
	snap := c.snapshot()
	local := netpolicy.LocalPod{Pod: snap.Pods[t.namespace+"/"+t.pod], IPs: t.ips}
	_, gen, err := c.syncPod(ctx, snap, c.o.Compile(snap, []netpolicy.LocalPod{local}), node, t)
	if err == nil {
		c.o.Metrics.duration.WithLabelValues("add").Observe(time.Since(start).Seconds())
		// The other local pods' policies may select this one, whose
		// address the API may not show yet: a pass adds it.
		c.trigger()
	}
	return gen, err
}
