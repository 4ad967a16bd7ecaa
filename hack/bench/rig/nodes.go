package rig

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
)

// Pod to pod across two nodes. Every xnode-* row gets two "node"
// namespaces of its own, joined by one veth (direct) or each by a veth to
// a router namespace, on subnets of their own (vxlan); the bench then
// attaches one pod on each node. The kernel rows'
// routes are made with ip as flannel makes them (host-gw; the vxlan
// backend's device, onlink routes, permanent neighbour and FDB entries);
// the usernet rows' by the node agent's own code, noderoutes.Manager,
// run once in each node (`bench noderoutes`). Every row has its nodes
// to itself, so the rows share no device or route, and the same
// addresses serve every row.

const (
	// UnderlayMTU is the MTU of the links between the nodes.
	UnderlayMTU = 1500
	// VXLANOverhead is what VXLAN takes off a pod's MTU: the 50 bytes of
	// outer IPv4, UDP, VXLAN and inner Ethernet headers, as flannel's
	// vxlan backend and the agent (--mtu) count them.
	VXLANOverhead = 50
	// xLinkDev is each node's underlay link (a veth).
	xLinkDev = "ubxlink"
	// The kernel VXLAN rows' device as flannel's vxlan backend makes
	// it: flannel.<VNI>, VNI 1, the kernel's default port 8472, no
	// learning.
	FlannelDev  = "flannel.1"
	FlannelVNI  = 1
	FlannelPort = 8472
)

// Node is one node of a cross-node row.
type Node struct {
	Name    string       // its node name: "a" (the client's) or "b"
	NS      string       // its namespace
	IP      netip.Prefix // its InternalIP on xLinkDev
	PodCIDR netip.Prefix
	// Router is the router's address on the node's subnet (vxlan), and
	// RouterDev the router's end of the node's link.
	Router    netip.Addr
	RouterDev string
}

// CrossNodes are the nodes of row: on one /24, or with vxlan each on its
// own /24 behind the router. The addresses are the same for every row:
// each row's namespaces are its own.
func CrossNodes(row string, vxlan bool) [2]Node {
	n := [2]Node{
		{Name: "a", NS: NSPrefix + row + "-a", PodCIDR: netip.MustParsePrefix("10.199.64.0/24")},
		{Name: "b", NS: NSPrefix + row + "-b", PodCIDR: netip.MustParsePrefix("10.199.65.0/24")},
	}
	if !vxlan {
		n[0].IP = netip.MustParsePrefix("10.199.66.1/24")
		n[1].IP = netip.MustParsePrefix("10.199.66.2/24")
		return n
	}
	n[0].IP, n[0].Router, n[0].RouterDev = netip.MustParsePrefix("10.199.67.2/24"), netip.MustParseAddr("10.199.67.1"), "ubxa"
	n[1].IP, n[1].Router, n[1].RouterDev = netip.MustParsePrefix("10.199.68.2/24"), netip.MustParseAddr("10.199.68.1"), "ubxb"
	return n
}

// routerNS is the router namespace of a vxlan row.
func routerNS(row string) string { return NSPrefix + row + "-r" }

// NodePair is one cross-node row's nodes and how they are joined.
type NodePair struct {
	Row   string // the row, in its namespaces' names
	Nodes [2]Node
	// VXLAN puts the nodes behind a router, VXLAN between them; else
	// they share one link.
	VXLAN  bool
	PodMTU int // the pods' MTU, the agent's --mtu
	// AgentRoutes routes between the nodes with the node agent's
	// noderoutes.Manager; else with ip as flannel does.
	AgentRoutes bool
	// Self is the bench's executable, whose noderoutes role runs the
	// agent's code in a node.
	Self string
}

// BuildNodes makes p's nodes and the routes between them.
func (r *Rig) BuildNodes(ctx context.Context, p NodePair) error {
	if err := r.crossTopology(ctx, p); err != nil {
		return fmt.Errorf("building the nodes: %w", err)
	}
	var err error
	if p.AgentRoutes {
		err = agentRoutes(ctx, p)
	} else {
		err = flannelRoutes(ctx, p)
	}
	if err != nil {
		return fmt.Errorf("routing between the nodes: %w", err)
	}
	return nil
}

// crossTopology makes the nodes' namespaces (and the router's), links
// them and turns forwarding on.
func (r *Rig) crossTopology(ctx context.Context, p NodePair) error {
	nodes := p.Nodes
	var cmds [][]string // {namespace, argv...}
	nss := []string{nodes[0].NS, nodes[1].NS}
	if !p.VXLAN {
		cmds = append(cmds, []string{nodes[0].NS, "ip", "link", "add", xLinkDev, "type", "veth", "peer", "name", xLinkDev, "netns", nodes[1].NS})
	} else {
		rt := routerNS(p.Row)
		nss = append(nss, rt)
		for _, n := range nodes {
			cmds = append(cmds,
				[]string{n.NS, "ip", "link", "add", xLinkDev, "type", "veth", "peer", "name", n.RouterDev, "netns", rt},
				[]string{rt, "ip", "addr", "add", netip.PrefixFrom(n.Router, n.IP.Bits()).String(), "dev", n.RouterDev},
				[]string{rt, "ip", "link", "set", n.RouterDev, "up"})
		}
	}
	for _, n := range nodes {
		cmds = append(cmds,
			[]string{n.NS, "ip", "addr", "add", n.IP.String(), "dev", xLinkDev},
			[]string{n.NS, "ip", "link", "set", xLinkDev, "up"})
	}
	if p.VXLAN {
		// Each node reaches the other's subnet through the router, as
		// nodes in two racks do: no link in common.
		for i, n := range nodes {
			peer := nodes[1-i]
			cmds = append(cmds, []string{n.NS, "ip", "route", "add", peer.IP.Masked().String(), "via", n.Router.String()})
		}
	}
	for _, ns := range nss {
		if err := r.AddNS(ctx, ns); err != nil {
			return err
		}
		cmds = append(cmds, []string{ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"})
	}
	return runIn(ctx, cmds)
}

// runIn runs each {namespace, argv...} in turn.
func runIn(ctx context.Context, cmds [][]string) error {
	for _, cmd := range cmds {
		if _, err := Output(ctx, 10*time.Second, cmd[0], cmd[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// flannelRoutes routes between the nodes with ip the way flannel does:
// host-gw, a route to the peer's pod CIDR via its InternalIP; vxlan, the
// device flannel.1 with the node's pod CIDR network address, and per
// peer an onlink route via the peer's device address, a permanent
// neighbour entry for that address at the peer device's MAC and an FDB
// entry sending that MAC to the peer's InternalIP. flannel lets the kernel
// choose a device's MAC and publishes it on the Node; here each is
// derived from the node's address, which both nodes know.
func flannelRoutes(ctx context.Context, p NodePair) error {
	nodes := p.Nodes
	var cmds [][]string
	for i, n := range nodes {
		peer := nodes[1-i]
		if !p.VXLAN {
			cmds = append(cmds, []string{n.NS, "ip", "route", "add", peer.PodCIDR.String(), "via", peer.IP.Addr().String(), "dev", xLinkDev})
			continue
		}
		peerVTEP := peer.PodCIDR.Addr().String()
		cmds = append(cmds,
			[]string{n.NS, "ip", "link", "add", FlannelDev, "address", flannelMAC(n), "mtu", strconv.Itoa(UnderlayMTU - VXLANOverhead), "type", "vxlan",
				"id", strconv.Itoa(FlannelVNI), "local", n.IP.Addr().String(), "dev", xLinkDev, "dstport", strconv.Itoa(FlannelPort), "nolearning"},
			[]string{n.NS, "ip", "addr", "add", netip.PrefixFrom(n.PodCIDR.Addr(), 32).String(), "dev", FlannelDev},
			[]string{n.NS, "ip", "link", "set", FlannelDev, "up"},
			[]string{n.NS, "ip", "neigh", "replace", peerVTEP, "lladdr", flannelMAC(peer), "dev", FlannelDev, "nud", "permanent"},
			[]string{n.NS, "bridge", "fdb", "append", flannelMAC(peer), "dev", FlannelDev, "dst", peer.IP.Addr().String(), "self", "permanent"},
			[]string{n.NS, "ip", "route", "add", peer.PodCIDR.String(), "via", peerVTEP, "dev", FlannelDev, "onlink"})
	}
	return runIn(ctx, cmds)
}

// flannelMAC is the kernel VXLAN rows' device MAC of node n: locally
// administered, the node's IPv4 address in the last four bytes.
func flannelMAC(n Node) string {
	a := n.IP.Addr().As4()
	return net.HardwareAddr{0x0e, 0x99, a[0], a[1], a[2], a[3]}.String()
}

// agentRoutes runs noderoutes.Manager once in each node with both nodes
// as the API server would list them (InternalIP, podCIDR): host-gw
// routes when the peer is on a subnet of the node, the agent's VXLAN
// device, peers and port guard otherwise (encapsulation auto).
func agentRoutes(ctx context.Context, p NodePair) error {
	nodes := p.Nodes
	var list []noderoutes.Node
	for _, n := range nodes {
		list = append(list, noderoutes.Node{Name: n.Name, InternalIPs: []netip.Addr{n.IP.Addr()}, PodCIDRs: []netip.Prefix{n.PodCIDR}})
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		out, err := Output(ctx, 30*time.Second, n.NS, p.Self, "noderoutes", "--self", n.Name, "--nodes", string(raw), "--pod-mtu", strconv.Itoa(p.PodMTU))
		if err != nil {
			return err
		}
		runlog.Logf("%s: node %s: %s", p.Row, n.Name, strings.TrimSpace(string(out)))
	}
	return nil
}

// NodeRoutesMain is the "noderoutes" role: one Sync of the agent's
// node routes in the current network namespace. It prints the routes and
// fails on any error, problem or note (a wrong MTU): the row measures a
// working setup or none.
func NodeRoutesMain(args []string) int {
	fs := flag.NewFlagSet("noderoutes", flag.ContinueOnError)
	self := fs.String("self", "", "this node's name in --nodes")
	nodesJSON := fs.String("nodes", "", "the nodes, JSON: [{Name, InternalIPs, PodCIDRs}]")
	podMTU := fs.Int("pod-mtu", UnderlayMTU, "the pods' MTU (the agent's --mtu)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var nodes []noderoutes.Node
	if err := json.Unmarshal([]byte(*nodesJSON), &nodes); err != nil {
		fmt.Fprintln(os.Stderr, "parsing --nodes:", err)
		return 2
	}
	m, err := noderoutes.New(noderoutes.Options{Self: *self, PodMTU: *podMTU, Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	st, err := m.Sync(nodes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sync:", err)
		return 1
	}
	if len(st.Problems) > 0 || len(st.Notes) > 0 || len(st.Routes) == 0 {
		fmt.Fprintf(os.Stderr, "sync: routes %v, problems %v, notes %v\n", st.Routes, st.Problems, st.Notes)
		return 1
	}
	var rs []string
	for _, r := range st.Routes {
		rs = append(rs, r.String())
	}
	fmt.Println("agent routes:", strings.Join(rs, "; "))
	return 0
}
