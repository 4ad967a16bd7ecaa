package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
)

// Pod to pod across two nodes. Every xnode-* row gets two "node"
// namespaces of its own, joined by one veth (direct) or each by a veth to
// a router namespace, on subnets of their own (vxlan), and one pod on
// each node, attached through the real plugin by libcni in that node
// with host-local handing out the node's own pod CIDR. The kernel rows'
// routes are made with ip as flannel makes them (host-gw; the vxlan
// backend's device, onlink routes, permanent neighbour and FDB entries);
// the usernet rows' by the node agent's own code, noderoutes.Manager,
// run once in each node (`bench noderoutes`). Every row has its nodes
// to itself, so the rows share no device or route, and the same
// addresses serve every row.

// crossNodeRows, in --only, stands for every cross-node row.
const crossNodeRows = "xnode"

const (
	// xVXLANMTU is the pods' MTU on a VXLAN row: the underlay's 1500 less
	// the 50 bytes of outer IPv4, UDP, VXLAN and inner Ethernet headers,
	// as flannel's vxlan backend and the agent (--mtu) set it.
	xVXLANMTU = mtu - 50
	// xLinkDev is each node's underlay link (a veth).
	xLinkDev = "ubxlink"
	// The kernel VXLAN rows' device as flannel's vxlan backend makes
	// it: flannel.<VNI>, VNI 1, the kernel's default port 8472, no
	// learning.
	xFlannelDev  = "flannel.1"
	xFlannelVNI  = 1
	xFlannelPort = 8472
)

// xnode is one node of a cross-node row.
type xnode struct {
	Name    string       // its node name: "a" (the client's) or "b"
	NS      string       // its namespace
	IP      netip.Prefix // its InternalIP on xLinkDev
	PodCIDR netip.Prefix
	// Router is the router's address on the node's subnet (vxlan), and
	// RouterDev the router's end of the node's link.
	Router    netip.Addr
	RouterDev string
}

// crossNodes are the nodes of row c: on one /24 (direct) or each on its
// own /24 behind the router (vxlan). The addresses are the same for
// every row: each row's namespaces are its own.
func crossNodes(c *config) [2]xnode {
	n := [2]xnode{
		{Name: "a", NS: nsPrefix + c.Name + "-a", PodCIDR: netip.MustParsePrefix("10.199.64.0/24")},
		{Name: "b", NS: nsPrefix + c.Name + "-b", PodCIDR: netip.MustParsePrefix("10.199.65.0/24")},
	}
	if c.CrossNode == "direct" {
		n[0].IP = netip.MustParsePrefix("10.199.66.1/24")
		n[1].IP = netip.MustParsePrefix("10.199.66.2/24")
		return n
	}
	n[0].IP, n[0].Router, n[0].RouterDev = netip.MustParsePrefix("10.199.67.2/24"), netip.MustParseAddr("10.199.67.1"), "ubxa"
	n[1].IP, n[1].Router, n[1].RouterDev = netip.MustParsePrefix("10.199.68.2/24"), netip.MustParseAddr("10.199.68.1"), "ubxb"
	return n
}

// routerNS is the router namespace of a vxlan row.
func routerNS(c *config) string { return nsPrefix + c.Name + "-r" }

// attachCrossNode builds row c's nodes, their routes and a pod on each;
// it returns the pod on node B (the servers'), whose client is the pod
// on node A.
func (b *bench) attachCrossNode(ctx context.Context, c *config) (*attachment, error) {
	nodes := crossNodes(c)
	if err := b.crossTopology(ctx, c, nodes); err != nil {
		return nil, fmt.Errorf("building the nodes: %w", err)
	}
	var err error
	if c.AgentRoutes {
		err = b.agentRoutes(ctx, c, nodes)
	} else {
		err = b.flannelRoutes(ctx, c, nodes)
	}
	if err != nil {
		return nil, fmt.Errorf("routing between the nodes: %w", err)
	}
	cli, err := b.attachCrossPod(ctx, c, nodes[0])
	if err != nil {
		return nil, err
	}
	srv, err := b.attachCrossPod(ctx, c, nodes[1])
	if err != nil {
		return nil, err
	}
	srv.client = cli
	runlog.Logf("%s: client pod %s ip %s on node %s", c.Name, cli.NS, cli.IP, cli.Node)
	return srv, nil
}

// crossTopology makes the nodes' namespaces (and the router's), links
// them and turns forwarding on.
func (b *bench) crossTopology(ctx context.Context, c *config, nodes [2]xnode) error {
	var cmds [][]string // {namespace, argv...}
	nss := []string{nodes[0].NS, nodes[1].NS}
	if c.CrossNode == "direct" {
		cmds = append(cmds, []string{nodes[0].NS, "ip", "link", "add", xLinkDev, "type", "veth", "peer", "name", xLinkDev, "netns", nodes[1].NS})
	} else {
		r := routerNS(c)
		nss = append(nss, r)
		for _, n := range nodes {
			cmds = append(cmds,
				[]string{n.NS, "ip", "link", "add", xLinkDev, "type", "veth", "peer", "name", n.RouterDev, "netns", r},
				[]string{r, "ip", "addr", "add", netip.PrefixFrom(n.Router, n.IP.Bits()).String(), "dev", n.RouterDev},
				[]string{r, "ip", "link", "set", n.RouterDev, "up"})
		}
	}
	for _, n := range nodes {
		cmds = append(cmds,
			[]string{n.NS, "ip", "addr", "add", n.IP.String(), "dev", xLinkDev},
			[]string{n.NS, "ip", "link", "set", xLinkDev, "up"})
	}
	if c.CrossNode == "vxlan" {
		// Each node reaches the other's subnet through the router, as
		// nodes in two racks do: no link in common.
		for i, n := range nodes {
			peer := nodes[1-i]
			cmds = append(cmds, []string{n.NS, "ip", "route", "add", peer.IP.Masked().String(), "via", n.Router.String()})
		}
	}
	for _, ns := range nss {
		if err := b.rig.AddNS(ctx, ns); err != nil {
			return err
		}
		cmds = append(cmds, []string{ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"})
	}
	return b.runIn(ctx, cmds)
}

// runIn runs each {namespace, argv...} in turn.
func (b *bench) runIn(ctx context.Context, cmds [][]string) error {
	for _, cmd := range cmds {
		if _, err := rig.Output(ctx, 10*time.Second, cmd[0], cmd[1:]...); err != nil {
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
func (b *bench) flannelRoutes(ctx context.Context, c *config, nodes [2]xnode) error {
	var cmds [][]string
	for i, n := range nodes {
		peer := nodes[1-i]
		if c.CrossNode == "direct" {
			cmds = append(cmds, []string{n.NS, "ip", "route", "add", peer.PodCIDR.String(), "via", peer.IP.Addr().String(), "dev", xLinkDev})
			continue
		}
		peerVTEP := peer.PodCIDR.Addr().String()
		cmds = append(cmds,
			[]string{n.NS, "ip", "link", "add", xFlannelDev, "address", flannelMAC(n), "mtu", strconv.Itoa(xVXLANMTU), "type", "vxlan",
				"id", strconv.Itoa(xFlannelVNI), "local", n.IP.Addr().String(), "dev", xLinkDev, "dstport", strconv.Itoa(xFlannelPort), "nolearning"},
			[]string{n.NS, "ip", "addr", "add", netip.PrefixFrom(n.PodCIDR.Addr(), 32).String(), "dev", xFlannelDev},
			[]string{n.NS, "ip", "link", "set", xFlannelDev, "up"},
			[]string{n.NS, "ip", "neigh", "replace", peerVTEP, "lladdr", flannelMAC(peer), "dev", xFlannelDev, "nud", "permanent"},
			[]string{n.NS, "bridge", "fdb", "append", flannelMAC(peer), "dev", xFlannelDev, "dst", peer.IP.Addr().String(), "self", "permanent"},
			[]string{n.NS, "ip", "route", "add", peer.PodCIDR.String(), "via", peerVTEP, "dev", xFlannelDev, "onlink"})
	}
	return b.runIn(ctx, cmds)
}

// flannelMAC is the kernel VXLAN rows' device MAC of node n: locally
// administered, the node's IPv4 address in the last four bytes.
func flannelMAC(n xnode) string {
	a := n.IP.Addr().As4()
	return net.HardwareAddr{0x0e, 0x99, a[0], a[1], a[2], a[3]}.String()
}

// agentRoutes runs noderoutes.Manager once in each node with both nodes
// as the API server would list them (InternalIP, podCIDR): host-gw
// routes when the peer is on a subnet of the node, the agent's VXLAN
// device, peers and port guard otherwise (encapsulation auto).
func (b *bench) agentRoutes(ctx context.Context, c *config, nodes [2]xnode) error {
	var list []noderoutes.Node
	for _, n := range nodes {
		list = append(list, noderoutes.Node{Name: n.Name, InternalIPs: []netip.Addr{n.IP.Addr()}, PodCIDRs: []netip.Prefix{n.PodCIDR}})
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return err
	}
	podMTU := mtu
	if c.MTU > 0 {
		podMTU = c.MTU
	}
	for _, n := range nodes {
		out, err := rig.Output(ctx, 30*time.Second, n.NS, b.self, "noderoutes", "--self", n.Name, "--nodes", string(raw), "--pod-mtu", strconv.Itoa(podMTU))
		if err != nil {
			return err
		}
		runlog.Logf("%s: node %s: %s", c.Name, n.Name, strings.TrimSpace(string(out)))
	}
	return nil
}

// nodeRoutesMain is the "noderoutes" role: one Sync of the agent's
// node routes in the current network namespace. It prints the routes and
// fails on any error, problem or note (a wrong MTU): the row measures a
// working setup or none.
func nodeRoutesMain(args []string) int {
	fs := flag.NewFlagSet("noderoutes", flag.ContinueOnError)
	self := fs.String("self", "", "this node's name in --nodes")
	nodesJSON := fs.String("nodes", "", "the nodes, JSON: [{Name, InternalIPs, PodCIDRs}]")
	podMTU := fs.Int("pod-mtu", mtu, "the pods' MTU (the agent's --mtu)")
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

// attachCrossPod attaches row c's pod on node n through the plugin, run
// in n's namespace with n's pod CIDR, state and IPAM directories.
func (b *bench) attachCrossPod(ctx context.Context, c *config, n xnode) (*attachment, error) {
	a := &attachment{Config: c.Name, NS: nsPrefix + c.Name + "-pod-" + n.Name, ID: nsPrefix + c.Name + "-" + n.Name, cfg: c, Node: n.NS}
	conf, err := c.conflistIn(n.PodCIDR.String(), filepath.Join(b.tmp, "ipam-"+n.NS), b.stateDir(a), filepath.Join(b.logs, "cni-usernet"), filepath.Join(b.tmp, "run"), false)
	if err != nil {
		return nil, err
	}
	if err := b.register(ctx, a, conf, c.Name+"-"+n.Name+".conflist"); err != nil {
		return nil, err
	}
	if _, err := b.cniAdd(ctx, a, "--id", a.ID, "--netns", "/run/netns/"+a.NS); err != nil {
		return nil, err
	}
	if c.usernet() {
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return nil, err
		}
		a.StackPID, a.Status = st.PID, st.raw
		if err := checkGSO(c, st); err != nil {
			b.fail(0, c.Name, "gso-check", err)
		}
	}
	return a, nil
}

// stateDir is the plugin's state directory on a's node.
func (b *bench) stateDir(a *attachment) string {
	if a.Node != "" {
		return filepath.Join(b.tmp, "state-"+a.Node)
	}
	return filepath.Join(b.tmp, "state")
}
