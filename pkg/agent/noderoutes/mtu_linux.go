package noderoutes

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PodMTU chooses the pods' MTU in the network namespace of the calling
// thread (the node's): o.MTU when the operator set one; otherwise the
// smallest MTU of the links up that carry the node's traffic to other
// nodes, less the VXLAN overhead unless o.Encapsulation is EncapNever.
//
// Those links are the one holding an InternalIP of the node (the VXLAN
// underlay, and the link to the peers on its subnet) and those of the
// default routes (to the peers behind a router), per family. Loopback
// never counts: a node whose InternalIP is a /32 on lo reaches nobody
// through lo, and its 65536 bytes would make the pods' packets too large
// for every real link. The links the routes to the present peers take
// are not asked: the choice goes into the conflist once, at the agent's
// start, and must not depend on which nodes had joined by then.
func PodMTU(o MTUOptions) (MTUChoice, error) {
	if o.MTU != 0 {
		return chooseMTU(o, nil)
	}
	links, err := underlayLinks(o.InternalIPs)
	if err != nil {
		return MTUChoice{}, err
	}
	return chooseMTU(o, links)
}

// underlayLinks collects the links PodMTU chooses from.
func underlayLinks(internalIPs []netip.Addr) ([]underlayLink, error) {
	all, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing this node's links: %w", err)
	}
	usable := map[int]netlink.Link{}
	for _, l := range all {
		a := l.Attrs()
		if a.Flags&net.FlagUp == 0 || a.Flags&net.FlagLoopback != 0 || a.Name == vxlanName4 || a.Name == vxlanName6 {
			continue
		}
		usable[a.Index] = l
	}
	var out []underlayLink
	type linkFamily struct {
		index int
		v4    bool
	}
	seen := map[linkFamily]bool{}
	add := func(index int, v4 bool, why string) {
		l, ok := usable[index]
		key := linkFamily{index, v4}
		if !ok || seen[key] {
			return
		}
		seen[key] = true
		out = append(out, underlayLink{name: l.Attrs().Name, mtu: l.Attrs().MTU, v4: v4, why: why})
	}
	if len(internalIPs) > 0 {
		addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("listing this node's addresses: %w", err)
		}
		for _, ip := range internalIPs {
			ip = ip.Unmap()
			for _, a := range addrs {
				if have, ok := netip.AddrFromSlice(a.IP); ok && have.Unmap() == ip {
					add(a.LinkIndex, ip.Is4(), "InternalIP "+ip.String())
				}
			}
		}
	}
	for _, v4 := range []bool{true, false} {
		fam := netlink.FAMILY_V4
		if !v4 {
			fam = netlink.FAMILY_V6
		}
		routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("listing this node's %s routes: %w", familyName(v4), err)
		}
		why := familyName(v4) + " default route"
		for _, r := range routes {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			add(r.LinkIndex, v4, why)
			for _, nh := range r.MultiPath {
				add(nh.LinkIndex, v4, why)
			}
		}
	}
	return out, nil
}
