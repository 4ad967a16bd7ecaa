// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The pod-to-pod rows on one node (pod2pod-*): two pods in the node
// namespace the node→pod rows use, attached through the real plugin with
// the same network and IPAM, so that each gets a host route to its
// host-side veth from the plugin itself (ptp's, or cni-usernet's made the
// same way) and the node forwards between them. The load generators run
// in pod A, the servers in pod B: every request crosses both pods' stacks
// and the node, as service-to-service traffic does. The workloads are
// the cross-node rows' (crossnode_workloads.go).

// sameNodeRows, in --only, stands for every pod-to-pod row on one node.
const sameNodeRows = "pod2pod"

// attachSameNode attaches row c's two pods; it returns pod B (the
// servers'), whose client is pod A.
func (b *bench) attachSameNode(ctx context.Context, c *config) (*attachment, error) {
	var pods [2]*attachment
	for i, side := range []string{"a", "b"} {
		a := &attachment{Config: c.Name, NS: nsPrefix + "pod-" + c.Name + "-" + side, ID: "ub-" + c.Name + "-" + side, cfg: c}
		conf, err := c.conflist(filepath.Join(b.tmp, "ipam"), b.stateDir(a), filepath.Join(b.logs, "cni-usernet"), filepath.Join(b.tmp, "run"), b.o.IPv6)
		if err != nil {
			return nil, err
		}
		if err := b.addPod(ctx, a, conf, c.Name+"-"+side+".conflist"); err != nil {
			return nil, err
		}
		pods[i] = a
	}
	pods[1].client = pods[0]
	runlog.Logf("%s: client pod %s ip %s host veth %s", c.Name, pods[0].NS, pods[0].IP, pods[0].HostVeth)
	return pods[1], nil
}
