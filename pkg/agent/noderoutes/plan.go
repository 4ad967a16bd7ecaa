// Package noderoutes gives a node routes to every other node's pod CIDRs
// in standalone mode: each CIDR via that node's InternalIP of the same
// family, when the two nodes share a link (the kubenet / flannel host-gw
// model). A node that is reachable only through a router gets no route and
// is reported: its pods need an overlay (or a chained primary CNI).
//
// The routes carry their own routing protocol number (Protocol), so that
// the kernel's table is the only record: a sync lists what is ours by that
// number, adds what is missing, replaces what changed and deletes what is
// no longer wanted, and RemoveAll takes every one of them away on
// uninstall. Routes of any other protocol are never changed.
//
// Plan is pure (table-tested); Manager applies a plan with netlink.
package noderoutes

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// Node is what routing needs of a Kubernetes Node.
type Node struct {
	Name string
	// InternalIPs are the node's status.addresses of type InternalIP.
	InternalIPs []netip.Addr
	// PodCIDRs are spec.podCIDRs (spec.podCIDR on old API servers).
	PodCIDRs []netip.Prefix
}

// Route is one route this node wants: Dst via the node Via.
type Route struct {
	Dst  netip.Prefix
	Via  netip.Addr
	Node string
}

func (r Route) String() string { return fmt.Sprintf("%s via %s (node %s)", r.Dst, r.Via, r.Node) }

// Problem is a pod CIDR of another node that gets no route, and why.
type Problem struct {
	Node   string
	Dst    netip.Prefix
	Reason string
}

func (p Problem) String() string {
	return fmt.Sprintf("node %s: pods in %s unreachable from this node: %s", p.Node, p.Dst, p.Reason)
}

// Plan is the routes self wants to the other nodes, one per pod CIDR via
// the first InternalIP of the CIDR's family, and the CIDRs that cannot
// have one. Nodes and CIDRs come out sorted, so equal inputs give equal
// plans. A CIDR that overlaps one of self's own pod CIDRs is a problem,
// never a route: self's pods are on its own links.
func Plan(self string, nodes []Node) ([]Route, []Problem) {
	var own []netip.Prefix
	for _, n := range nodes {
		if n.Name == self {
			own = append(own, n.PodCIDRs...)
		}
	}
	var routes []Route
	var probs []Problem
	seen := map[netip.Prefix]string{}
	sorted := slices.Clone(nodes)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, n := range sorted {
		if n.Name == self {
			continue
		}
		for _, c := range n.PodCIDRs {
			c = c.Masked()
			if slices.ContainsFunc(own, func(o netip.Prefix) bool { return o.Overlaps(c) }) {
				probs = append(probs, Problem{n.Name, c, "overlaps this node's own pod CIDR"})
				continue
			}
			if other, dup := seen[c]; dup {
				probs = append(probs, Problem{n.Name, c, "also the pod CIDR of node " + other})
				continue
			}
			via, ok := sameFamily(n.InternalIPs, c.Addr().Is4())
			if !ok {
				fam := "IPv6"
				if c.Addr().Is4() {
					fam = "IPv4"
				}
				probs = append(probs, Problem{n.Name, c, "the node has no " + fam + " InternalIP"})
				continue
			}
			seen[c] = n.Name
			routes = append(routes, Route{Dst: c, Via: via, Node: n.Name})
		}
	}
	sort.Slice(routes, func(i, j int) bool { return routes[i].Dst.String() < routes[j].Dst.String() })
	return routes, probs
}

func sameFamily(ips []netip.Addr, v4 bool) (netip.Addr, bool) {
	for _, ip := range ips {
		ip = ip.Unmap()
		if ip.Is4() == v4 && ip.IsValid() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
