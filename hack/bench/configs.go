package main

import (
	"encoding/json"
	"fmt"
)

// Network addresses used by every configuration. They exist only inside the
// namespaces the benchmark creates.
const (
	subnet4 = "10.199.0.0/24"
	subnet6 = "fd99::/64"
	mtu     = 1500
	netName = "bench" // one network name, so host-local hands out distinct IPs to all pods
)

// config is one way of attaching a pod.
type config struct {
	Name   string
	Desc   string
	Plugin string // "ptp" or "cni-usernet"
	GSO    string // cni-usernet "gso" key; empty for ptp
	// NoOffload turns tso/gso/sg off on both veth ends. cni-usernet is also
	// given podLinkOffloadsOff, so that its GSO detection, which runs
	// during ADD, sees the link that way.
	NoOffload bool
	// GSOMaxSegs, when non-zero, is set on both veth ends after ADD.
	// cni-usernet is also given gsoMaxSegs, the cap its detection would
	// have read from such a link.
	GSOMaxSegs int
	// Peer, when set, is another userspace network stack measured beside
	// cni-usernet (peers.go): "runsc" (attached through ptp, then its
	// sandbox takes the veth over), "pasta" or "slirp4netns" (no CNI: a tap
	// device in the pod namespace, the process in the node namespace).
	Peer string
	// PeerArgs are extra flags of the peer (runsc's GSO flags).
	PeerArgs []string
	// Method says how the peer is set up and which path the traffic takes;
	// BENCHMARKS.md repeats it.
	Method string
	// Baseline runs cni-usernet as built from another revision
	// (--baseline-bin, run.sh --baseline REV): the old build beside the new
	// one in the same interleaved run, for A/B checks of a change.
	Baseline bool
	// Keys are more conflist keys of cni-usernet: a setting's A/B beside
	// its default (e.g. wireQueueLen, stackThreads).
	Keys map[string]any
	// ByName runs the configuration only when --only names it: A/B rows
	// stay out of full runs.
	ByName bool
	// PolicyRules, when non-zero, pushes a policy of that many rules per
	// direction after ADD, the last one allowing the node (benchPolicy);
	// Keys must turn networkPolicy on.
	PolicyRules int
	// CrossNode, when set, is the topology of a pod-to-pod row across
	// two nodes of its own (crossnode.go): "direct" (one link, host-gw
	// routes) or "vxlan" (the nodes behind a router, VXLAN between them).
	// The client runs in the pod on node A, the server in the pod on B.
	CrossNode string
	// SameNode makes a pod-to-pod row on one node (samenode.go): two
	// pods in the node namespace, the client in pod A, the server in
	// pod B, the node routing between them as the plugin set it up.
	SameNode bool
	// Service makes a pod-to-pod row on one node reach pod B through a
	// cluster IP that the node translates (nftables DNAT in prerouting,
	// as kube-proxy's nftables mode), in a node namespace of its own so
	// that the other rows' node keeps no conntrack (samenode.go).
	Service bool
	// AgentRoutes makes a cross-node row's routes (and VXLAN devices)
	// with the node agent's noderoutes.Manager, as users' nodes get them;
	// without it they are made with ip the way flannel makes them.
	AgentRoutes bool
	// MTU is the pods' MTU; zero: mtu.
	MTU int
	// RatioTo is the row this one's ratios are taken against; empty:
	// baseline.
	RatioTo string
}

// ratioTo is the row c's ratios are taken against.
func (c *config) ratioTo() string {
	if c.RatioTo != "" {
		return c.RatioTo
	}
	return baseline
}

func (c *config) usernet() bool { return c.Plugin == "cni-usernet" }

// stack says whether the pod's traffic crosses a userspace stack process
// whose CPU and memory the benchmark reads: cni-usernet's or a peer's.
func (c *config) stack() bool { return c.usernet() || c.Peer != "" }

// benchBPFDir is where the benchmark's ADDs pin the socket redirect's
// programs.
const benchBPFDir = "/sys/fs/bpf/cni-usernet-bench"

// baseline is the configuration every ratio is taken against.
const baseline = "kernel"

var allConfigs = []*config{
	{Name: "kernel", Plugin: "ptp", Desc: "kernel veth (ptp), offloads on"},
	{Name: "kernel-nooffload", Plugin: "ptp", NoOffload: true, Desc: "kernel veth, tso/gso/sg off on both ends"},
	{Name: "kernel-segs2", Plugin: "ptp", GSOMaxSegs: 2, Desc: "kernel veth, gso_max_segs 2 on both ends"},
	{Name: "usernet-hardware", Plugin: "cni-usernet", GSO: "hardware", Desc: `cni-usernet "gso": "hardware"`},
	{Name: "usernet-software", Plugin: "cni-usernet", GSO: "software", Desc: `cni-usernet "gso": "software"`},
	{Name: "usernet-off", Plugin: "cni-usernet", GSO: "off", Desc: `cni-usernet "gso": "off"`},
	{Name: "usernet-auto-nooffload", Plugin: "cni-usernet", GSO: "auto", NoOffload: true, Desc: `cni-usernet "gso": "auto", tso/gso/sg off on the link`},
	{Name: "usernet-segs2", Plugin: "cni-usernet", GSO: "hardware", GSOMaxSegs: 2, Desc: `cni-usernet "gso": "hardware", gso_max_segs 2 on the link`},
	{Name: "usernet-hardware-nobusypoll", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"busyPoll": "0s"},
		Desc: `cni-usernet "gso": "hardware", "busyPoll": "0s" (busy polling off; by default the stack's governor switches it)`},
	{Name: "usernet-hardware-busypoll", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"busyPoll": "200us"},
		Desc: `cni-usernet "gso": "hardware", "busyPoll": "200us" (the stack's thread polls for 200 µs after every traffic, whatever the node's load)`},
	{Name: "usernet-hardware-redirect", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"socketRedirect": "on"},
		Desc: `cni-usernet "gso": "hardware", "socketRedirect": "on" (what the applications send to the stack redirected)`},
	{Name: "usernet-hardware-redirectboth", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"socketRedirect": "both"},
		Desc: `cni-usernet "gso": "hardware", "socketRedirect": "both" (the stack's writes to the applications redirected too: the benchmark's servers read with read(2))`},
	{Name: "usernet-hardware-busypoll50", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"busyPoll": "50us"}, ByName: true,
		Desc: `cni-usernet "gso": "hardware", "busyPoll": "50us"`},
	{Name: "usernet-hardware-noqueue", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"wireQueueLen": -1}, ByName: true,
		Desc: `cni-usernet "gso": "hardware", "wireQueueLen": -1 (no wire queue)`},
	{Name: "usernet-hardware-2threads", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"stackThreads": 2}, ByName: true,
		Desc: `cni-usernet "gso": "hardware", "stackThreads": 2`},
	{Name: "usernet-software-2threads", Plugin: "cni-usernet", GSO: "software", Keys: map[string]any{"stackThreads": 2}, ByName: true,
		Desc: `cni-usernet "gso": "software", "stackThreads": 2`},
	{Name: "usernet-hardware-nogro", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"gro": false}, ByName: true,
		Desc: `cni-usernet "gso": "hardware", "gro": false`},
	{Name: "usernet-software-nogro", Plugin: "cni-usernet", GSO: "software", Keys: map[string]any{"gro": false}, ByName: true,
		Desc: `cni-usernet "gso": "software", "gro": false`},
	{Name: "usernet-off-nogro", Plugin: "cni-usernet", GSO: "off", Keys: map[string]any{"gro": false}, ByName: true,
		Desc: `cni-usernet "gso": "off", "gro": false`},
	{Name: "usernet-auto-nooffload-nogro", Plugin: "cni-usernet", GSO: "auto", NoOffload: true, Keys: map[string]any{"gro": false}, ByName: true,
		Desc: `cni-usernet "gso": "auto", "gro": false, tso/gso/sg off on the link`},
	{Name: "usernet-policy1k", Plugin: "cni-usernet", GSO: "hardware", Keys: map[string]any{"networkPolicy": true}, PolicyRules: 1000, ByName: true,
		Desc: `cni-usernet "gso": "hardware", "networkPolicy": true, a 1,000-rule policy each way whose last rule allows the node`},
	{Name: "baseline-hardware", Plugin: "cni-usernet", GSO: "hardware", Baseline: true, Desc: `cni-usernet built from run.sh --baseline REV, "gso": "hardware" (only with --baseline-bin)`},
	{Name: "baseline-software", Plugin: "cni-usernet", GSO: "software", Baseline: true, Desc: `cni-usernet built from run.sh --baseline REV, "gso": "software" (only with --baseline-bin)`},
	{Name: "baseline-hardware-redirect", Plugin: "cni-usernet", GSO: "hardware", Baseline: true, ByName: true, Keys: map[string]any{"socketRedirect": "on"},
		Desc: `cni-usernet built from run.sh --baseline REV, "gso": "hardware", "socketRedirect": "on" (only with --baseline-bin)`},
	{Name: "baseline-hardware-redirectboth", Plugin: "cni-usernet", GSO: "hardware", Baseline: true, ByName: true, Keys: map[string]any{"socketRedirect": "both"},
		Desc: `cni-usernet built from run.sh --baseline REV, "gso": "hardware", "socketRedirect": "both" (only with --baseline-bin)`},
	{Name: "pod2pod-kernel", Plugin: "ptp", SameNode: true, RatioTo: "pod2pod-kernel",
		Desc: "pod to pod on one node: two ptp pods, the node routing between their veths"},
	{Name: "pod2pod-usernet", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel",
		Desc: `pod to pod on one node: two cni-usernet "gso": "hardware" pods, the node routing between their veths`},
	{Name: "pod2pod-usernet-nobusypoll", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Keys: map[string]any{"busyPoll": "0s"}, ByName: true,
		Desc: `pod to pod on one node: two cni-usernet "gso": "hardware", "busyPoll": "0s" pods (busy polling off in both stacks)`},
	{Name: "pod2pod-usernet-redirect", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Keys: map[string]any{"socketRedirect": "on"},
		Desc: `pod to pod on one node: two cni-usernet "gso": "hardware", "socketRedirect": "on" pods`},
	{Name: "pod2pod-usernet-redirectboth", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Keys: map[string]any{"socketRedirect": "both"},
		Desc: `pod to pod on one node: two cni-usernet "gso": "hardware", "socketRedirect": "both" pods`},
	{Name: "pod2pod-usernet-direct", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Keys: map[string]any{"socketRedirect": "direct"},
		Desc: `pod to pod on one node: two cni-usernet "gso": "hardware", "socketRedirect": "direct" pods (their connection joined application socket to application socket)`},
	{Name: "pod2pod-kernel-svc", Plugin: "ptp", SameNode: true, Service: true, RatioTo: "pod2pod-kernel-svc",
		Desc: "pod to pod on one node through a Service: two ptp pods, the client dialing a cluster IP the node DNATs to pod B"},
	{Name: "pod2pod-usernet-svc", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, Service: true, RatioTo: "pod2pod-kernel-svc",
		Desc: `pod to pod on one node through a Service: two cni-usernet "gso": "hardware" pods, the client dialing a cluster IP the node DNATs to pod B`},
	{Name: "pod2pod-usernet-direct-svc", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, Service: true, RatioTo: "pod2pod-kernel-svc", Keys: map[string]any{"socketRedirect": "direct"},
		Desc: `pod to pod on one node through a Service: two cni-usernet "gso": "hardware", "socketRedirect": "direct" pods, the client dialing a cluster IP the node DNATs to pod B`},
	{Name: "pod2pod-baseline", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Baseline: true, ByName: true,
		Desc: `pod to pod on one node: two pods of cni-usernet built from run.sh --baseline REV, "gso": "hardware" (only with --baseline-bin)`},
	{Name: "pod2pod-baseline-direct", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Baseline: true, ByName: true, Keys: map[string]any{"socketRedirect": "direct"},
		Desc: `pod to pod on one node: two pods of cni-usernet built from run.sh --baseline REV, "gso": "hardware", "socketRedirect": "direct" (only with --baseline-bin)`},
	{Name: "pod2pod-baseline-redirectboth", Plugin: "cni-usernet", GSO: "hardware", SameNode: true, RatioTo: "pod2pod-kernel", Baseline: true, ByName: true, Keys: map[string]any{"socketRedirect": "both"},
		Desc: `pod to pod on one node: two pods of cni-usernet built from run.sh --baseline REV, "gso": "hardware", "socketRedirect": "both" (only with --baseline-bin)`},
	{Name: "xnode-kernel", Plugin: "ptp", CrossNode: "direct", RatioTo: "xnode-kernel",
		Desc: "pod to pod across two nodes on one link: ptp pods, host-gw routes made with ip"},
	{Name: "xnode-usernet", Plugin: "cni-usernet", GSO: "hardware", CrossNode: "direct", AgentRoutes: true, RatioTo: "xnode-kernel",
		Desc: `pod to pod across two nodes on one link: cni-usernet "gso": "hardware" pods, routes by the agent's noderoutes`},
	{Name: "xnode-baseline", Plugin: "cni-usernet", GSO: "hardware", CrossNode: "direct", AgentRoutes: true, RatioTo: "xnode-kernel", Baseline: true, ByName: true,
		Desc: `pod to pod across two nodes, direct: cni-usernet built from run.sh --baseline REV, "gso": "hardware" (only with --baseline-bin; the node routes from this tree's agent code)`},
	{Name: "xnode-kernel-vxlan", Plugin: "ptp", CrossNode: "vxlan", MTU: xVXLANMTU, RatioTo: "xnode-kernel-vxlan",
		Desc: "pod to pod across two nodes behind a router: ptp pods, kernel VXLAN made with ip as flannel's vxlan backend makes it"},
	{Name: "xnode-usernet-vxlan", Plugin: "cni-usernet", GSO: "hardware", CrossNode: "vxlan", MTU: xVXLANMTU, AgentRoutes: true, RatioTo: "xnode-kernel-vxlan",
		Desc: `pod to pod across two nodes behind a router: cni-usernet "gso": "hardware" pods, kernel VXLAN by the agent's noderoutes`},
	{Name: "runsc-hostgso", Plugin: "ptp", Peer: "runsc", PeerArgs: []string{"--gso=true"},
		Desc:   "gVisor runsc netstack, host GSO (--gso=true)",
		Method: "servers in one runsc sandbox (systrap, --network=sandbox) joined to the pod namespace; runsc takes over the ptp veth eth0 (AF_PACKET, PACKET_VNET_HDR) and its addresses and routes"},
	{Name: "runsc-softgso", Plugin: "ptp", Peer: "runsc", PeerArgs: []string{"--gso=false", "--software-gso=true"},
		Desc:   "gVisor runsc netstack, software GSO (--gso=false --software-gso=true)",
		Method: "as runsc-hostgso, but netstack segments itself and writes each segment to the AF_PACKET socket"},
	{Name: "pasta-tap", Peer: "pasta",
		Desc:   "pasta (passt), tap path: L2↔L4 translation",
		Method: "pasta runs in the node namespace with a tap eth0 in the pod namespace (MTU 65520, its default); clients connect to a non-loopback node address pasta forwards (-t), so every connection crosses the tap, never the loopback splice"},
	{Name: "slirp4netns", Peer: "slirp4netns",
		Desc:   "slirp4netns (libslirp), MTU 1500",
		Method: "slirp4netns runs in the node namespace with a tap in the pod namespace (--configure, its default MTU 1500: with 65520 redis-benchmark's 50 connections stalled until reset here); clients connect to a node address slirp4netns forwards (add_hostfwd on its API socket) to the pod"},
}

// isPeer says whether name is a peer's configuration.
func isPeer(name string) bool {
	c := configByName(name)
	return c != nil && c.Peer != ""
}

// addConfigs are the plugins whose ADD latency is measured, with the
// attachment configuration used for it.
var addConfigs = []struct{ Name, Of string }{
	{"add-ptp", "kernel"},
	{"add-cni-usernet", "usernet-hardware"},
}

func configByName(name string) *config {
	for _, c := range allConfigs {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// conflist renders the CNI network configuration list for c. stateDir and
// logDir are only used by cni-usernet, ipamDir by host-local; runDir by
// a configuration with PolicyRules (its control sockets, and the node
// agent's socket its ADD asks, served by the benchmark: standInAgent).
func (c *config) conflist(ipamDir, stateDir, logDir, runDir string, ipv6 bool) ([]byte, error) {
	return c.conflistIn(subnet4, ipamDir, stateDir, logDir, runDir, ipv6)
}

// conflistIn is conflist with the pods' IPv4 subnet: a cross-node row's
// node hands out addresses of its own pod CIDR.
func (c *config) conflistIn(sub4, ipamDir, stateDir, logDir, runDir string, ipv6 bool) ([]byte, error) {
	ranges := [][]map[string]string{{{"subnet": sub4}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if ipv6 {
		ranges = append(ranges, []map[string]string{{"subnet": subnet6}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	ipam := map[string]any{"type": "host-local", "dataDir": ipamDir, "ranges": ranges, "routes": routes}
	podMTU := mtu
	if c.MTU > 0 {
		podMTU = c.MTU
	}
	plugin := map[string]any{"type": c.Plugin, "mtu": podMTU, "ipam": ipam}
	switch c.Plugin {
	case "ptp":
		plugin["ipMasq"] = false
	case "cni-usernet":
		plugin["gso"] = c.GSO
		plugin["stateDir"] = stateDir
		plugin["logDir"] = logDir
		if !c.Baseline {
			// The socket redirect's programs, loaded by the first ADD,
			// apart from a node's own and unloaded by cleanup.
			plugin["bpfDir"] = benchBPFDir
		}
		if c.NoOffload {
			plugin["podLinkOffloadsOff"] = true
		}
		if c.GSOMaxSegs > 0 {
			plugin["gsoMaxSegs"] = c.GSOMaxSegs
		}
		for k, v := range c.Keys {
			plugin[k] = v
		}
		if c.PolicyRules > 0 {
			plugin["runDir"] = runDir
		}
	default:
		return nil, fmt.Errorf("configuration %s has no CNI plugin (%q)", c.Name, c.Plugin)
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.1.0",
		"name":       netName,
		"plugins":    []any{plugin},
	}, "", "  ")
}
