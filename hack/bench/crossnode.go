package main

import (
	"context"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The cross-node rows' pods: row c's two nodes (rig.BuildNodes) with a pod on
// each, attached through the real plugin by libcni in that node with
// host-local handing out the node's own pod CIDR.

// crossNodeRows, in --only, stands for every cross-node row.
const crossNodeRows = "xnode"

// The kernel VXLAN rows' pod MTU, and their device as flannel's vxlan
// backend makes it (rig.BuildNodes).
const (
	xVXLANMTU    = mtu - rig.VXLANOverhead
	xFlannelDev  = rig.FlannelDev
	xFlannelVNI  = rig.FlannelVNI
	xFlannelPort = rig.FlannelPort
)

// crossNodes are the nodes of row c.
func crossNodes(c *config) [2]rig.Node { return rig.CrossNodes(c.Name, c.CrossNode == "vxlan") }

// attachCrossNode builds row c's nodes, their routes and a pod on each;
// it returns the pod on node B (the servers'), whose client is the pod
// on node A.
func (b *bench) attachCrossNode(ctx context.Context, c *config) (*attachment, error) {
	nodes := crossNodes(c)
	podMTU := mtu
	if c.MTU > 0 {
		podMTU = c.MTU
	}
	if err := b.rig.BuildNodes(ctx, rig.NodePair{Row: c.Name, Nodes: nodes, VXLAN: c.CrossNode == "vxlan", PodMTU: podMTU, AgentRoutes: c.AgentRoutes, Self: b.self}); err != nil {
		return nil, err
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

// attachCrossPod attaches row c's pod on node n through the plugin, run
// in n's namespace with n's pod CIDR, state and IPAM directories.
func (b *bench) attachCrossPod(ctx context.Context, c *config, n rig.Node) (*attachment, error) {
	a := &attachment{Config: c.Name, NS: nsPrefix + c.Name + "-pod-" + n.Name, ID: nsPrefix + c.Name + "-" + n.Name, cfg: c, Node: n.NS}
	conf, err := c.conflistIn(n.PodCIDR.String(), filepath.Join(b.tmp, "ipam-"+n.NS), b.stateDir(a), filepath.Join(b.logs, "cni-usernet"), filepath.Join(b.tmp, "run"), false)
	if err != nil {
		return nil, err
	}
	return a, b.addPod(ctx, a, conf, c.Name+"-"+n.Name+".conflist")
}

// addPod registers pod a of a pod-to-pod row with conflist conf, saved
// as name, and runs ADD for it in its node; a cni-usernet pod's stack is
// then asked for its PID and the GSO it took.
func (b *bench) addPod(ctx context.Context, a *attachment, conf []byte, name string) error {
	if err := b.register(ctx, a, conf, name); err != nil {
		return err
	}
	if _, err := b.cniAdd(ctx, a, "--id", a.ID, "--netns", "/run/netns/"+a.NS); err != nil {
		return err
	}
	if a.cfg.usernet() {
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return err
		}
		a.StackPID, a.Status = st.PID, st.raw
		if err := checkGSO(a.cfg, st); err != nil {
			b.fail(0, a.Config, "gso-check", err)
		}
	}
	return nil
}

// stateDir is the plugin's state directory on a's node.
func (b *bench) stateDir(a *attachment) string {
	if a.Node != "" {
		return filepath.Join(b.tmp, "state-"+a.Node)
	}
	return filepath.Join(b.tmp, "state")
}
