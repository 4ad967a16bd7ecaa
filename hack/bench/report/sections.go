package report

import (
	"fmt"
	"strconv"
	"strings"
)

// Cross is the cross-node section: its rows and the topology its text
// names.
type Cross struct {
	Rows []Row
	// VXLANMTU is the pods' MTU on a VXLAN row; FlannelDev, FlannelVNI
	// and FlannelPort the kernel rows' VXLAN device, AgentVNI and
	// AgentPort the node agent's.
	VXLANMTU            int
	FlannelDev          string
	FlannelVNI          int
	FlannelPort         int
	AgentVNI, AgentPort int
}

// SameNode is the section of pod to pod on one node.
type SameNode struct {
	Rows []Row
	// Subnet is the pods' IPv4 subnet, the node→pod rows' own; Baseline
	// the row the others' ratios are taken against.
	Subnet, Baseline string
	// Service, when set, is the Service rows' baseline: their pods in a
	// node of their own (ServiceSubnet), the client dialing a cluster IP
	// that node DNATs to pod B.
	Service, ServiceSubnet string
}

// podCPUText says what the CPU columns of a pod-to-pod section count.
const podCPUText = "CPU per unit of work: all CPUs (/proc/stat); both pods' stacks; the client, the load generator in pod A (its rusage); " +
	"the server in pod B (/proc/PID/stat); the rest, all CPUs less those processes: the kernel work no process was charged for " +
	"(the node's forwarding, softirqs run outside the processes) and whatever else ran on the machine meanwhile. " +
	"A kernel without IRQ time accounting (CONFIG_IRQ_TIME_ACCOUNTING) charges the softirq work it does while a process runs to that process: " +
	"a kernel row's client and server then carry much of the other end's receive work.\n"

// sameNodeSection writes the section of pod to pod on one node: a table
// per group, ratios to its kernel row.
func (d *Data) sameNodeSection(w *strings.Builder) {
	x := d.SameNode
	fmt.Fprintf(w, "\n## Pod to pod on one node\n\n")
	fmt.Fprintf(w, "Two pods per row in the node namespace of the node→pod rows, attached through the plugin with the same network (host-local, %s); "+
		"each pod's host route to its host-side veth is the plugin's own (ptp's; cni-usernet's, made the same way) and the node forwards between them. "+
		"The servers in pod B, the clients in pod A, so that every request crosses both pods' stacks: iperf3 one stream each way (A→B: pod A sending), "+
		"redis-benchmark as in the node→pod rows, TCP_RR. Ratios to `%s`. ", x.Subnet, x.Baseline)
	if x.Service != "" {
		fmt.Fprintf(w, "The `-svc` rows reach pod B through a Service: their two pods in a node namespace of their own (%s), whose nftables DNAT "+
			"(prerouting, as kube-proxy's nftables mode) turns a cluster IP of the row into pod B's address; their ratios are to `%s`. ", x.ServiceSubnet, x.Service)
	}
	w.WriteString(podCPUText)
	groups, byGroup := groupsOf(CrossMetrics)
	for _, g := range groups {
		fmt.Fprintf(w, "\n### %s\n\n", g)
		d.grid(w, byGroup[g], x.Rows)
	}
}

// Scale is the scale section: ScaleIdleRow's idle pods, then concurrent
// streams for StreamRows.
type Scale struct {
	Pods       int
	Streams    []int
	StreamRows []Row
}

// Limits is the limits section: a row per configuration and limit.
type Limits struct {
	Rows   []Row
	Labels []string // the limits, as a pod spec writes them
	RedisN []int    // redis-benchmark's -n under each limit
	// PeriodMs is the CFS period of the limits' quotas.
	PeriodMs int
}

// crossSection writes the cross-node section: a table per group, ratios
// to the kernel row of the same topology.
func (d *Data) crossSection(w *strings.Builder) {
	x := d.Cross
	fmt.Fprintf(w, "\n## Pod to pod across two nodes\n\n")
	fmt.Fprintf(w, "Two node namespaces per row, a pod on each attached through the plugin (host-local: node A 10.199.64.0/24, node B 10.199.65.0/24); "+
		"the servers in the pod on node B, the clients in the pod on node A. direct: the nodes on one veth (10.199.66.0/24), host-gw routes; "+
		"vxlan: each node on its own /24 to a router namespace, pods across in kernel VXLAN (pod MTU %d). Kernel rows: ptp pods, routes made with ip as flannel makes them "+
		"(vxlan: %s, VNI %d, port %d); usernet rows: the agent's noderoutes.Manager (vxlan: its device, VNI %d, port %d, and its port guard). "+
		"Ratios to the kernel row of the same topology. ",
		x.VXLANMTU, x.FlannelDev, x.FlannelVNI, x.FlannelPort, x.AgentVNI, x.AgentPort)
	w.WriteString(podCPUText)
	groups, byGroup := groupsOf(CrossMetrics)
	for _, g := range groups {
		fmt.Fprintf(w, "\n### %s\n\n", g)
		d.grid(w, byGroup[g], x.Rows)
	}
	for _, c := range x.Rows {
		if cl := d.Cells[c.Name]["vxlan_gb"]; cl != nil {
			fmt.Fprintf(w, "\n%s: %s GB crossed node A's VXLAN device in the whole run.\n", c.Name, FmtNum(cl.Max))
		}
	}
}

// scaleSection writes the scale section: idle pods, then streams.
func (d *Data) scaleSection(w *strings.Builder) {
	sc := d.Scale
	fmt.Fprintf(w, "\n## Scale: %d idle cni-usernet pods (usernet-hardware), attached one at a time\n\n", sc.Pods)
	d.grid(w, scaleMetrics, []Row{{Name: ScaleIdleRow, AnyFailure: true}})
	fmt.Fprintf(w, "\nPSS from /proc/PID/smaps_rollup of every stack, summed (a page shared by k processes counts 1/k in each, so the binary's text counts once), divided by the pods. ADD of the last 20 runs with %d stacks already up.\n", sc.Pods-20)
	fmt.Fprintf(w, "\n## Scale: concurrent TCP streams node→pod (iperf3 -P, %s)\n\n", d.Settings.IperfTime)
	d.grid(w, streamMetrics(sc.Streams), sc.StreamRows)
}

// limitsSection writes the limits section: one row per limit and
// configuration, ratios to the kernel veth under the same limit.
func (d *Data) limitsSection(w *strings.Builder) {
	l := d.Limits
	var ns []string
	for _, n := range l.RedisN {
		ns = append(ns, strconv.Itoa(n))
	}
	fmt.Fprintf(w, "\n## Under a pod's CPU limit\n\n")
	fmt.Fprintf(w, "The pod's server (and for cni-usernet its stack) in a cgroup with the limit's CFS quota (period %d ms; `max`: no quota); the clients in the node namespace, unlimited. iperf3 %s per direction, redis-benchmark -n %s (limits %s). Ratios to `kernel` under the same limit. The stack's share: its CPU time over the pod cgroup's. Throttled: the share of CFS periods in which the pod used up its quota. Machine: all CPUs' busy cores, the clients and the softirq work no pod is billed for included.\n",
		l.PeriodMs, d.Settings.IperfTime, strings.Join(ns, " / "), strings.Join(l.Labels, " / "))
	_, byGroup := groupsOf(limitMetrics)
	for _, g := range []string{"What the pod gets", "Where its CPU goes"} {
		fmt.Fprintf(w, "\n### %s\n\n", g)
		d.grid(w, byGroup[g], l.Rows)
	}
}

// sizingSection writes the sizing section: the stack's memory by phase.
func (d *Data) sizingSection(w *strings.Builder) {
	fmt.Fprintf(w, "\n## Sizing: a stack's memory, alone in its pod's cgroup (usernet-hardware)\n\n")
	if why, ok := d.Skipped[SizingRow]; ok {
		fmt.Fprintf(w, "skipped: %s\n", mdCell(why))
		return
	}
	if len(d.Cells[SizingRow]) == 0 {
		why := d.failedWhy(SizingRow, "", false)
		if why == "" {
			why = "no numbers"
		}
		fmt.Fprintf(w, "failed: %s\n", mdCell(why))
		return
	}
	fmt.Fprintf(w, "MiB. The stack in the cgroup the plugin put it in, its pod's (found by the pod's UID), alone. RSS: the stack's VmRSS, RssAnon and RssFile (the binary's text, shared by every stack on the node and charged to whichever cgroup first read it). Charged: the pod cgroup's memory.usage_in_bytes (v1) or memory.current (v2); anon and file from memory.stat, kernel: v1's kmem counter (no socket buffers: v1 charges them only under a TCP limit) or v2's kernel + sock. Peaks sampled every 100 ms. iperf3 %s per direction, redis-benchmark -n %d.\n\n", d.Settings.IperfTime, d.Settings.RedisN)
	fmt.Fprintf(w, "| phase |")
	for _, q := range sizingQuantities {
		fmt.Fprintf(w, " %s |", q.Label)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(sizingQuantities)))
	for _, p := range sizingPhases {
		fmt.Fprintf(w, "| %s |", p.Label)
		for _, q := range sizingQuantities {
			if c := d.Cells[SizingRow][p.Key+"_"+q.Key]; c != nil {
				fmt.Fprintf(w, " %s |", FmtNum(c.Median))
			} else {
				fmt.Fprintf(w, " — |")
			}
		}
		fmt.Fprintln(w)
	}
}
