// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
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
	node, sub4, ipam := "", subnet4, filepath.Join(b.tmp, "ipam")
	if c.Service {
		var err error
		if node, err = b.serviceNode(ctx); err != nil {
			return nil, err
		}
		sub4, ipam = serviceSubnet, filepath.Join(b.tmp, "ipam-"+serviceNodeNS)
	}
	for i, side := range []string{"a", "b"} {
		a := &attachment{Config: c.Name, NS: nsPrefix + "pod-" + c.Name + "-" + side, ID: "ub-" + c.Name + "-" + side, cfg: c, Node: node}
		conf, err := c.conflistIn(sub4, ipam, b.stateDir(a), filepath.Join(b.logs, "cni-usernet"), filepath.Join(b.tmp, "run"), b.o.IPv6 && !c.Service)
		if err != nil {
			return nil, err
		}
		if err := b.addPod(ctx, a, conf, c.Name+"-"+side+".conflist"); err != nil {
			return nil, err
		}
		pods[i] = a
	}
	pods[1].client = pods[0]
	if c.Service {
		if err := b.addService(ctx, pods[1]); err != nil {
			return nil, err
		}
	}
	runlog.Logf("%s: client pod %s ip %s host veth %s, dialing %s", c.Name, pods[0].NS, pods[0].IP, pods[0].HostVeth, pods[1].dialIP())
	return pods[1], nil
}

// The Service rows' node: a namespace of its own, whose nftables DNAT
// makes it track connections (conntrack), as a kube-proxy node does; the
// other rows' node keeps none. Its pods have a subnet of their own, so
// that no address is also a pod's of the other node (the socket
// redirect's owners map is the machine's).
const (
	serviceNodeNS = nsPrefix + "svcnode"
	serviceSubnet = "10.199.69.0/24"
	// serviceVIPs: row n's cluster IP is the (n+1)th address.
	serviceVIPs = "10.199.71.0/24"
)

// serviceNode makes the Service rows' node once.
func (b *bench) serviceNode(ctx context.Context) (string, error) {
	b.mu.Lock()
	up := b.svcNodeUp
	b.mu.Unlock()
	if up {
		return serviceNodeNS, nil
	}
	if err := b.rig.AddNS(ctx, serviceNodeNS); err != nil {
		return "", err
	}
	rules := "table ip ub_svc {\n\tchain pre { type nat hook prerouting priority dstnat; }\n}\n"
	if err := b.nftIn(ctx, serviceNodeNS, rules); err != nil {
		return "", err
	}
	b.mu.Lock()
	b.svcNodeUp = true
	b.mu.Unlock()
	return serviceNodeNS, nil
}

// addService gives pod srv a cluster IP of its own in its node, every
// TCP port DNATed to the pod's address, and has its client dial it.
func (b *bench) addService(ctx context.Context, srv *attachment) error {
	b.mu.Lock()
	b.svcRows++
	n := b.svcRows
	b.mu.Unlock()
	vip := netip.MustParsePrefix(serviceVIPs).Addr()
	for range n {
		vip = vip.Next()
	}
	rule := fmt.Sprintf("add rule ip ub_svc pre ip daddr %s meta l4proto tcp dnat to %s\n", vip, srv.IP)
	if err := b.nftIn(ctx, srv.nodeNS(), rule); err != nil {
		return err
	}
	srv.Dial = vip.String()
	return nil
}

// nftIn loads nftables rules into namespace ns.
func (b *bench) nftIn(ctx context.Context, ns, rules string) error {
	f, err := os.CreateTemp(b.tmp, "nft-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(rules); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if _, err := rig.Output(ctx, 10*time.Second, ns, "nft", "-f", f.Name()); err != nil {
		return fmt.Errorf("nft in %s: %w", ns, err)
	}
	return nil
}
