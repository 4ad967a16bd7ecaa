package podkernel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Collect reads what the kernel has configured on ifName in the current
// network namespace. It changes nothing.
func Collect(ifName string) (*podnet.Spec, error) {
	link, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", ifName, err)
	}
	attrs := link.Attrs()
	s := &podnet.Spec{
		Version: podnet.SpecVersion,
		IfName:  ifName,
		MAC:     attrs.HardwareAddr.String(),
		MTU:     uint32(attrs.MTU),
	}
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses of %s: %w", ifName, err)
	}
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		if !ok || a.Scope == unix.RT_SCOPE_HOST {
			continue
		}
		s.Addrs = append(s.Addrs, p)
	}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{LinkIndex: attrs.Index, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes of %s: %w", ifName, err)
	}
	for _, r := range routes {
		if r.Type != unix.RTN_UNICAST {
			continue
		}
		rt, ok := routeOf(r)
		if !ok || rt.Dst.Addr().IsLinkLocalUnicast() || rt.Dst.Addr().IsMulticast() {
			continue
		}
		if !slices.Contains(s.Routes, rt) {
			s.Routes = append(s.Routes, rt)
		}
	}
	neighs, err := neighList(attrs.Index, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing neighbours of %s: %w", ifName, err)
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT == 0 || len(n.HardwareAddr) == 0 {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		s.Neighbors = append(s.Neighbors, podnet.Neighbor{IP: ip.Unmap(), MAC: n.HardwareAddr.String()})
	}
	return s, nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}

func routeOf(r netlink.Route) (podnet.Route, bool) {
	var rt podnet.Route
	if r.Dst == nil {
		// The kernel reports default routes with no destination.
		switch r.Family {
		case unix.AF_INET:
			rt.Dst = netip.MustParsePrefix("0.0.0.0/0")
		case unix.AF_INET6:
			rt.Dst = netip.MustParsePrefix("::/0")
		default:
			return rt, false
		}
	} else {
		p, ok := prefixOf(r.Dst)
		if !ok {
			return rt, false
		}
		rt.Dst = p.Masked()
	}
	if r.Gw != nil {
		gw, ok := netip.AddrFromSlice(r.Gw)
		if !ok {
			return rt, false
		}
		rt.Gw = gw.Unmap()
	}
	return rt, true
}

// Strip removes from the kernel what the stack takes over: routes first (as
// runsc does, so no route points at a vanished address), then addresses,
// then IPv6 on the link so the kernel sends no router solicitations, DAD or
// MLD of its own. Already gone is not an error, so Strip can be repeated
// after a restart.
func Strip(ifName string) error {
	link, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", ifName, err)
	}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{LinkIndex: link.Attrs().Index, Table: unix.RT_TABLE_UNSPEC},
		netlink.RT_FILTER_OIF)
	if err != nil {
		return fmt.Errorf("listing routes of %s: %w", ifName, err)
	}
	for _, r := range routes {
		if r.Table == unix.RT_TABLE_LOCAL {
			continue // removed with their addresses
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("removing route %s of %s: %w", r, ifName, err)
		}
	}
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", ifName, err)
	}
	for _, a := range addrs {
		if err := netlink.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("removing address %s of %s: %w", a.IPNet, ifName, err)
		}
	}
	if err := disableIPv6(ifName); err != nil {
		return err
	}
	return nil
}

func disableIPv6(ifName string) error {
	p := "/proc/sys/net/ipv6/conf/" + ifName + "/disable_ipv6"
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // kernel without IPv6
		}
		return fmt.Errorf("disabling IPv6 on %s: %w", ifName, err)
	}
	return nil
}
