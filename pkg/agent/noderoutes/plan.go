// Package noderoutes gives a node routes to every other node's pod CIDRs
// in standalone mode. Per peer node, the route is direct (via that node's
// InternalIP of the same family: the kubenet / flannel host-gw model) when
// the peer is on one of this node's connected subnets, and through a
// kernel VXLAN device otherwise (flannel's vxlan backend, Calico's
// CrossSubnet), as Encapsulation says. With EncapNever a node reachable
// only through a router gets no route and is reported: its pods need an
// overlay (or a chained primary CNI).
//
// The routes carry their own routing protocol number (Protocol), so that
// the kernel's table is the only record: a sync lists what is ours by that
// number, adds what is missing, replaces what changed and deletes what is
// no longer wanted, and RemoveAll takes every one of them away on
// uninstall. Routes of any other protocol are never changed. The VXLAN
// devices are ours whole: their permanent neighbour and FDB entries are
// kept the same way, and an nftables table (GuardTable) keeps their port
// to the other nodes' InternalIPs.
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

// Encapsulation says which peers are reached through VXLAN.
type Encapsulation string

const (
	// EncapAuto: direct when the peer's InternalIP is on one of this
	// node's connected subnets, VXLAN otherwise. The zero value.
	EncapAuto Encapsulation = "auto"
	// EncapVXLAN: every peer through VXLAN.
	EncapVXLAN Encapsulation = "vxlan"
	// EncapNever: every peer direct; one behind a router is a Problem.
	EncapNever Encapsulation = "never"
)

// ParseEncapsulation reads the agent's --encapsulation.
func ParseEncapsulation(s string) (Encapsulation, error) {
	switch e := Encapsulation(s); e {
	case EncapAuto, EncapVXLAN, EncapNever:
		return e, nil
	case "":
		return EncapAuto, nil
	}
	return "", fmt.Errorf("encapsulation %q: want auto, vxlan or never", s)
}

// Kind is how a route reaches the peer's pods.
type Kind string

const (
	// Direct: via the peer's InternalIP, on a link both nodes share.
	Direct Kind = "direct"
	// VXLAN: via the peer's pod CIDR network address on the VXLAN
	// device, whose FDB sends the frames to the peer's InternalIP.
	VXLAN Kind = "vxlan"
)

// Route is one route this node wants: Dst via Via. A direct route's Via
// is the peer's InternalIP; a VXLAN route's Via is Dst's network address
// (the peer's VXLAN device address) and Underlay the peer's InternalIP.
type Route struct {
	Dst      netip.Prefix
	Via      netip.Addr
	Node     string
	Kind     Kind       `json:",omitempty"`
	Underlay netip.Addr `json:",omitzero"`
	// Reason says why the route is of its Kind.
	Reason string `json:",omitempty"`
}

func (r Route) String() string {
	if r.Kind == VXLAN {
		return fmt.Sprintf("%s via %s (node %s, vxlan to %s)", r.Dst, r.Via, r.Node, r.Underlay)
	}
	return fmt.Sprintf("%s via %s (node %s)", r.Dst, r.Via, r.Node)
}

// Network is what Plan needs to know of this node beyond the node list.
type Network struct {
	Encap Encapsulation
	// OnLink are the prefixes of the addresses on this node's links (its
	// connected subnets): a peer whose InternalIP is inside one is on a
	// link this node shares.
	OnLink []netip.Prefix
}

// onLink says whether ip is on one of the connected subnets.
func (n Network) onLink(ip netip.Addr) bool {
	return slices.ContainsFunc(n.OnLink, func(p netip.Prefix) bool { return p.Masked().Contains(ip) })
}

// kind decides how a peer with InternalIP via is reached, and why.
func (n Network) kind(via netip.Addr) (Kind, string) {
	switch n.Encap {
	case EncapNever:
		return Direct, "encapsulation never"
	case EncapVXLAN:
		return VXLAN, "encapsulation vxlan"
	}
	if n.onLink(via) {
		return Direct, fmt.Sprintf("its InternalIP %s is on a subnet of this node", via)
	}
	return VXLAN, fmt.Sprintf("its InternalIP %s is on no subnet of this node", via)
}

// Problem is a pod CIDR of another node that gets no route, and why.
type Problem struct {
	Node   string
	Dst    netip.Prefix
	Reason string
}

func (p Problem) String() string {
	return fmt.Sprintf("node %s: pods in %s unreachable from this node: %s", p.Node, p.Dst, p.Reason)
}

// Plan is the routes self wants to the other nodes, one per pod CIDR
// through the first InternalIP of the CIDR's family, of the kind nw
// decides, and the CIDRs that cannot have one. Nodes and CIDRs come out
// sorted, so equal inputs give equal plans. A CIDR that overlaps one of
// self's own pod CIDRs is a problem, never a route: self's pods are on its
// own links. A VXLAN route needs self's InternalIP of the family (the
// tunnel's local end).
func Plan(self string, nodes []Node, nw Network) ([]Route, []Problem) {
	var own []netip.Prefix
	var ownIPs []netip.Addr
	for _, n := range nodes {
		if n.Name == self {
			own = append(own, n.PodCIDRs...)
			ownIPs = append(ownIPs, n.InternalIPs...)
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
			r := Route{Dst: c, Via: via, Node: n.Name}
			r.Kind, r.Reason = nw.kind(via)
			if r.Kind == VXLAN {
				local, ok := sameFamily(ownIPs, c.Addr().Is4())
				switch {
				case !ok:
					probs = append(probs, Problem{n.Name, c, r.Reason + ", and VXLAN needs this node's InternalIP of the family, which it has not"})
					continue
				case local == via:
					probs = append(probs, Problem{n.Name, c, fmt.Sprintf("its InternalIP %s is an address of this node", via)})
					continue
				}
				r.Underlay, r.Via = via, c.Addr()
			}
			seen[c] = n.Name
			routes = append(routes, r)
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
