package cni

import (
	"errors"
	"fmt"
	"net"
	"os"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// setupVeth creates the veth, its pod end in netns (the stack's own
// namespace; sandbox is the pod's, which the result names), and
// configures it like ptp: the pod gets its
// address with the subnet's mask, a host route to the gateway and the
// subnet (and the IPAM routes) via the gateway; the node side gets the
// gateway address as a /32 (/128) and a host route to the pod. Forwarding
// is enabled on the node, as ptp does.
func setupVeth(netns ns.NetNS, sandbox, ifName, hostName string, mtu int, result *current.Result) error {
	if err := ip.EnableForward(result.IPs); err != nil {
		return fmt.Errorf("enabling IP forwarding: %w", err)
	}
	var hostIface, podIface current.Interface
	err := netns.Do(func(hostNS ns.NetNS) error {
		hv, pv, err := ip.SetupVethWithName(ifName, hostName, mtu, "", hostNS)
		if err != nil {
			return fmt.Errorf("creating veth %s/%s: %w", hostName, ifName, err)
		}
		hostIface = current.Interface{Name: hv.Name, Mac: hv.HardwareAddr.String()}
		podIface = current.Interface{Name: pv.Name, Mac: pv.HardwareAddr.String(), Sandbox: sandbox}
		// The addresses are about to move into the pod's stack, which does
		// no duplicate address detection of its own; waiting for the
		// kernel's (ipam.ConfigureIface settles IPv6 addresses) would add
		// about two seconds to every dual-stack ADD.
		if err := disableDAD(ifName); err != nil {
			return err
		}
		for _, ipc := range result.IPs {
			ipc.Interface = current.Int(1)
		}
		result.Interfaces = []*current.Interface{&hostIface, &podIface}
		if err := ipam.ConfigureIface(ifName, result); err != nil {
			return fmt.Errorf("configuring %s: %w", ifName, err)
		}
		return routeViaGateway(ifName, result)
	})
	if err != nil {
		return err
	}
	return configureNodeEnd(hostName, result)
}

// routeViaGateway gives the pod end, ifName in the calling thread's
// namespace, a host route to each gateway and its subnet through it.
func routeViaGateway(ifName string, result *current.Result) error {
	link, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", ifName, err)
	}
	for _, ipc := range result.IPs {
		if ipc.Gateway == nil {
			continue
		}
		bits := 32
		if ipc.Address.IP.To4() == nil {
			bits = 128
		}
		subnet := &net.IPNet{IP: ipc.Address.IP.Mask(ipc.Address.Mask), Mask: ipc.Address.Mask}
		// Replace the on-link subnet route: every neighbour is reached
		// through the gateway, so the pod never ARPs for a peer the
		// node side would not answer for.
		_ = netlink.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: subnet, Scope: netlink.SCOPE_NOWHERE})
		for _, r := range []netlink.Route{
			{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: ipc.Gateway, Mask: net.CIDRMask(bits, bits)}, Scope: netlink.SCOPE_LINK, Src: ipc.Address.IP},
			{LinkIndex: link.Attrs().Index, Dst: subnet, Gw: ipc.Gateway, Src: ipc.Address.IP},
		} {
			if err := netlink.RouteReplace(&r); err != nil {
				return fmt.Errorf("adding route %s on %s: %w", r.Dst, ifName, err)
			}
		}
	}
	return nil
}

// configureNodeEnd gives the node end, hostName, each gateway address and
// a host route to the pod's address.
func configureNodeEnd(hostName string, result *current.Result) error {
	hv, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", hostName, err)
	}
	for _, ipc := range result.IPs {
		bits := 32
		if ipc.Address.IP.To4() == nil {
			bits = 128
		}
		if ipc.Gateway != nil {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: ipc.Gateway, Mask: net.CIDRMask(bits, bits)}}
			if bits == 128 {
				a.Flags = 0x02 // IFA_F_NODAD: the gateway is ours alone
			}
			if err := netlink.AddrReplace(hv, a); err != nil {
				return fmt.Errorf("adding gateway %s to %s: %w", ipc.Gateway, hostName, err)
			}
		}
		dst := &net.IPNet{IP: ipc.Address.IP, Mask: net.CIDRMask(bits, bits)}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: hv.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("adding route to %s on %s: %w", dst, hostName, err)
		}
	}
	return nil
}

func disableDAD(ifName string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+ifName+"/accept_dad", []byte("0"), 0o644)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disabling DAD on %s: %w", ifName, err)
	}
	return nil
}
