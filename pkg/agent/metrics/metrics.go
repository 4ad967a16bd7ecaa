// Package metrics exports the node's and every pod stack's counters in
// Prometheus' format; the node agent serves them. Pod series are read from
// each stack's control socket at each collection, which the agent makes
// on its own schedule (Cache), so a pod's series exist as long as its
// attachment, to within one collection.
package metrics

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cni-usernet/cni-usernet/pkg/agent/supervisor"
	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
)

// Options configure a Collector.
type Options struct {
	// Store is the node's attachment state; its directory also holds the
	// plugin's operation log (package oplog).
	Store state.Store
	// Agent is the supervisor's counters. Nil: no reconcile or restart
	// series.
	Agent *supervisor.Stats
	// AgentStarts is how often an agent has started on this node, this
	// one included (see CountStart).
	AgentStarts uint64
	// StatusTimeout bounds one stack's status query. Zero: 1 s.
	StatusTimeout time.Duration
	// Parallel is how many stacks are queried at once. Zero: 8.
	Parallel int
	// Budget bounds all of a collection's status queries: stacks not
	// asked by then are reported down (cni_usernet_pod_stack_up 0) rather
	// than holding the collection up. Zero: 5 s.
	Budget time.Duration
	Log    *slog.Logger
}

func (o *Options) defaults() {
	if o.StatusTimeout == 0 {
		o.StatusTimeout = time.Second
	}
	if o.Parallel == 0 {
		o.Parallel = 8
	}
	if o.Budget == 0 {
		o.Budget = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// podLabels name a pod's attachment on every pod series. gso_mode is the
// mode the stack runs in (hardware, software, off), decided at ADD.
var podLabels = []string{"namespace", "pod", "container_id", "interface", "gso_mode"}

func podDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc("cni_usernet_pod_"+name, help, append(append([]string{}, podLabels...), extra...), nil)
}

func nodeDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc("cni_usernet_"+name, help, extra, nil)
}

var (
	descStackUp = podDesc("stack_up",
		"Whether the pod's stack answered its status query in this scrape (1) or not (0).")
	descBytes = podDesc("bytes_total",
		"Bytes the pod's stack carried, by leg and direction. Leg wire: Ethernet frames on the pod's interface; leg app: payload exchanged with the applications' sockets. Direction ingress: towards the applications; egress: towards the network.",
		"leg", "direction")
	descPackets = podDesc("packets_total",
		"Frames on the pod's wire leg by direction (ingress: from the network). A frame sent as one GSO batch counts once.",
		"leg", "direction")
	descDropped = podDesc("dropped_packets_total",
		"Packets the pod's stack dropped, by reason: netstack (netstack's own drops), packet_socket (the kernel's packet socket overflowed), syn_socket (the same for the socket that carries the link's new-connection SYNs, a flood's), syn_rate_limit (SYNs shed beyond the admission cap), wire_queue (packets to the pod link dropped because the link took nothing from the full queue in front of it for 200 ms: a wedged link), listen_syn_queue and listen_ack_queue (a mirrored listener's queue was full), udp (datagrams the relay could not deliver), app_protocol (application packets of a protocol the relay does not carry).",
		"reason")
	descErrors = podDesc("errors_total",
		"Errors on the pod's wire leg, by kind: transmit (link write failures), ip_malformed, ip_outgoing, tcp_invalid_segment, tcp_checksum, syn_cookie_answer (fast-path SYN-ACKs the link's queue refused).",
		"kind")
	descSynCookies = podDesc("syn_cookies_total",
		"SYN cookies of the pod's wire leg, by result: sent (a mirrored listener's handshake backlog was full), fast_path (SYNs the link answered with the listener's cookie itself, during a flood), valid and invalid (the ACKs that came back).",
		"result")
	descSpoofed = podDesc("spoofed_dropped_total",
		"Packets dropped for a source that is not the pod's, by where: node (frames on the node end of the pod's veth without the pod's MAC or addresses, ARP and NDP included: the node's source guard) and stack (packets the pod's applications' leg handed the stack from another address).",
		"where")
	descPolicyDenied = podDesc("policy_denied_total",
		"Packets that would have opened a connection or flow the pod's network policy denied (dropped, unanswered; a client's SYN retransmissions count each), by direction (ingress: from the network; egress: the applications') and policy (the isolating NetworkPolicies, \"namespace/name\" joined with \",\"; \"(pending)\" before the node agent's first push).",
		"direction", "policy")
	descPolicyGeneration = podDesc("policy_generation",
		"Generation of the network policy the pod's stack enforces (absent when the stack does not enforce policy).")
	descRestarts = podDesc("stack_restarts_total",
		"Times the node agent restarted the pod's stack since ADD.")
	descCrashLoop = podDesc("stack_crash_loop",
		"Whether the pod's stack is in a crash loop (1): it died too often in a row shortly after starting.")
	descRSS = podDesc("stack_resident_memory_bytes",
		"Resident memory of the pod's stack process.")
	descCPU = podDesc("stack_cpu_seconds_total",
		"CPU time (user and system) of the pod's stack process since it started.")
	descThreads = podDesc("stack_threads",
		"Threads running the pod stack's Go code now (its GOMAXPROCS): one, and more while bulk traffic saturates them when the count is left to the stack's governor.")
	descBusyPoll = podDesc("busy_poll_active",
		"Whether the pod stack's thread busy-polls after traffic now (1) or sleeps (0); absent when busy polling is off for the pod.")
	descBusyPollEnabled = podDesc("busy_poll_enabled_total",
		"Times the stack's governor turned busy polling on: requests flowed on one thread and the node had idle CPU.")
	descGSOInfo = podDesc("gso_info",
		"The pod's GSO decision: requested is what the pod asked for (annotation, conflist or default auto), gso_mode what its stack runs.",
		"requested")
	descGSOMaxSize = podDesc("gso_max_size_bytes",
		"The GSO size limit detected on the pod's link.")
	descGSOMaxSegs = podDesc("gso_max_segments",
		"The GSO segment limit detected on the pod's link.")

	descAttachments = nodeDesc("attachments",
		"Pods attached on this node (state files).")
	descUnreadable = nodeDesc("attachments_unreadable",
		"Attachment state files the agent cannot read.")
	descReconciles = nodeDesc("reconcile_runs_total",
		"Reconcile passes of the node agent since it started.")
	descReclaimed = nodeDesc("reclaimed_attachments_total",
		"Attachments the node agent reclaimed because their network namespace was gone, by trigger: reconcile or stack_exit.",
		"trigger")
	descDirsRemoved = nodeDesc("removed_stack_directories_total",
		"Stack directories the node agent removed because nothing used them.")
	descUntracked = nodeDesc("untracked_stacks",
		"Stacks running without an attachment at the last reconcile (left running).")
	descAgentRestarts = nodeDesc("stack_restarts_total",
		"Restarts of dead stacks by this node agent, by result: success or failure.",
		"result")
	descGuardsRestored = nodeDesc("source_guards_restored_total",
		"Pods' source guards the node agent put back after something on the node removed them (an nftables flush, the table deleted).")
	descAgentStarts = nodeDesc("agent_starts_total",
		"Times a node agent started on this node (kept in the state directory across agent restarts).")
	descBadRecords = nodeDesc("plugin_operation_records_malformed_total",
		"Lines of the plugin's operation log the agent could not read.")
)

// Collector is a prometheus.Collector for the node and its pods.
type Collector struct {
	opts Options
	// ops holds the plugin's verbs, folded in from the operation log.
	ops *prometheus.HistogramVec
	// drainMu serializes drains, so records are observed in order;
	// badRecords is guarded by it.
	drainMu    sync.Mutex
	badRecords uint64
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a collector; register it with a prometheus.Registry.
func New(opts Options) *Collector {
	opts.defaults()
	return &Collector{
		opts: opts,
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cni_usernet_plugin_operation_duration_seconds",
			Help: "Duration of the CNI plugin's ADD, DEL and CHECK on this node, by operation and result (success, error, try_again_later).",
			// An ADD takes tens to hundreds of milliseconds (veth, IPAM,
			// the stack's start); DEL and CHECK a few.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"operation", "result"}),
	}
}

// Run drains the plugin's operation log every interval until ctx ends,
// so the log stays small between scrapes.
func (c *Collector) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.drain()
		}
	}
}

func (c *Collector) drain() {
	c.drainMu.Lock()
	defer c.drainMu.Unlock()
	recs, bad, err := agentapi.Drain(c.opts.Store.Dir)
	if err != nil {
		c.opts.Log.Warn("reading the plugin's operation log", "err", err)
		return
	}
	c.badRecords += uint64(bad)
	for _, r := range recs {
		c.ops.WithLabelValues(r.Verb, r.Result).Observe(r.Duration.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.ops.Describe(ch)
	for _, d := range []*prometheus.Desc{
		descStackUp, descBytes, descPackets, descDropped, descErrors, descSynCookies,
		descPolicyDenied, descPolicyGeneration, descSpoofed,
		descRestarts, descCrashLoop, descRSS, descCPU, descGSOInfo, descGSOMaxSize, descGSOMaxSegs,
		descAttachments, descUnreadable, descReconciles, descReclaimed, descDirsRemoved, descUntracked,
		descAgentRestarts, descAgentStarts, descBadRecords, descGuardsRestored,
	} {
		ch <- d
	}
	for _, d := range seriesDescs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.drain()
	c.ops.Collect(ch)
	c.drainMu.Lock()
	bad := c.badRecords
	c.drainMu.Unlock()
	ch <- counter(descBadRecords, float64(bad))
	c.collectNode(ch)

	atts, errs := c.opts.Store.List()
	ch <- gauge(descAttachments, float64(len(atts)))
	ch <- gauge(descUnreadable, float64(len(errs)))
	for _, p := range c.query(atts) {
		p.emit(ch)
	}
}

func (c *Collector) collectNode(ch chan<- prometheus.Metric) {
	ch <- counter(descAgentStarts, float64(c.opts.AgentStarts))
	a := c.opts.Agent
	if a == nil {
		return
	}
	ch <- counter(descReconciles, float64(a.ReconcileRuns.Load()))
	ch <- counter(descReclaimed, float64(a.ReclaimedByReconcile.Load()), "reconcile")
	ch <- counter(descReclaimed, float64(a.ReclaimedOnExit.Load()), "stack_exit")
	ch <- counter(descDirsRemoved, float64(a.StackDirsRemoved.Load()))
	ch <- gauge(descUntracked, float64(a.UntrackedStacks.Load()))
	ch <- counter(descAgentRestarts, float64(a.StackRestarts.Load()), "success")
	ch <- counter(descAgentRestarts, float64(a.RestartFailures.Load()), "failure")
	ch <- counter(descGuardsRestored, float64(a.SourceGuardsRestored.Load()))
}

// pod is what one scrape learned of one attachment.
type pod struct {
	att    *state.Attachment
	status *control.Status // nil: the stack did not answer
	usage  *procUsage      // nil: no live stack process
	// guardDrops is what the node's source guard dropped; guarded false:
	// the pod has no guard (or it could not be read).
	guardDrops uint64
	guarded    bool
}

// query asks every stack for its status, Parallel at a time, within the
// Budget.
func (c *Collector) query(atts []*state.Attachment) []pod {
	pods := make([]pod, len(atts))
	deadline := time.Now().Add(c.opts.Budget)
	sem := make(chan struct{}, c.opts.Parallel)
	var wg sync.WaitGroup
	for i, att := range atts {
		pods[i].att = att
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			left := time.Until(deadline)
			if left <= 0 {
				return
			}
			if att.SourceGuard != "" {
				if n, err := sourceguard.Dropped(att.SourceGuard); err == nil {
					pods[i].guardDrops, pods[i].guarded = n, true
				}
			}
			if u, err := readProc(att.StackPID, att.StackStartTime); err == nil {
				pods[i].usage = &u
			} else {
				return // no stack to ask
			}
			var st control.Status
			if err := control.FetchStatus(att.ControlSocket, min(left, c.opts.StatusTimeout), &st); err != nil {
				c.opts.Log.Debug("stack status unavailable", "containerID", att.ContainerID, "err", err)
				return
			}
			pods[i].status = &st
		}()
	}
	wg.Wait()
	return pods
}

func (p pod) emit(ch chan<- prometheus.Metric) {
	a := p.att
	labels := []string{a.PodNS, a.PodName, a.ContainerID, a.IfName, string(a.GSO.Mode)}
	m := func(d *prometheus.Desc, t prometheus.ValueType, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, append(labels[:len(labels):len(labels)], extra...)...)
	}
	ctr := func(d *prometheus.Desc, v uint64, extra ...string) {
		m(d, prometheus.CounterValue, float64(v), extra...)
	}

	m(descGSOInfo, prometheus.GaugeValue, 1, string(a.GSO.Requested))
	m(descGSOMaxSize, prometheus.GaugeValue, float64(a.GSO.Link.MaxSize))
	m(descGSOMaxSegs, prometheus.GaugeValue, float64(a.GSO.Link.MaxSegs))
	var restarts int
	var crashLoop float64
	if sv := a.Supervision; sv != nil {
		restarts = sv.Restarts
		if sv.Unhealthy != "" {
			crashLoop = 1
		}
	}
	m(descRestarts, prometheus.CounterValue, float64(restarts))
	m(descCrashLoop, prometheus.GaugeValue, crashLoop)
	if p.usage != nil {
		m(descRSS, prometheus.GaugeValue, p.usage.rssBytes)
		m(descCPU, prometheus.CounterValue, p.usage.cpuSeconds)
	}
	if p.guarded {
		ctr(descSpoofed, p.guardDrops, "node")
	}
	if p.status == nil {
		m(descStackUp, prometheus.GaugeValue, 0)
		return
	}
	m(descStackUp, prometheus.GaugeValue, 1)
	m(descThreads, prometheus.GaugeValue, float64(p.status.Threads.Threads))
	if bp := p.status.BusyPoll; bp != nil {
		on := 0.0
		if bp.On {
			on = 1
		}
		m(descBusyPoll, prometheus.GaugeValue, on)
		ctr(descBusyPollEnabled, bp.Enabled)
	}
	emitSeries(m, reflect.ValueOf(p.status.Wire), wireSeries)
	emitSeries(m, reflect.ValueOf(p.status.Relay), relaySeries)
	if pol := p.status.Policy; pol != nil {
		m(descPolicyGeneration, prometheus.GaugeValue, float64(pol.Generation))
		for label, n := range pol.Denied.Ingress {
			ctr(descPolicyDenied, n, "ingress", label)
		}
		for label, n := range pol.Denied.Egress {
			ctr(descPolicyDenied, n, "egress", label)
		}
	}
}

func counter(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}
