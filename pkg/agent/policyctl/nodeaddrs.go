package policyctl

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// vipDevices are links whose addresses are not the node's though they sit
// in its namespace: kube-proxy in IPVS mode puts every Service's ClusterIP
// on kube-ipvs0 so that the kernel accepts traffic to it. Counted as the
// node's, each ClusterIP would be let into every pod as if the node sent
// it. Calico's Felix leaves out the same device by default.
var vipDevices = []string{"kube-ipvs0"}

// nodeAddrs are the global unicast addresses of the agent's network
// namespace: the node's, since the agent runs in the host network. They
// include the node ends of the pods' veths (the gateways), the sources of
// the node's own connections to its pods, and leave out the Service VIPs
// of vipDevices.
func nodeAddrs() ([]netip.Addr, error) {
	// One dump of every address, then the links' names: a dump per link
	// would cost the node's whole address table once per pod veth. A dump
	// interrupted by address churn (pods coming and going) is retried: its
	// partial list would drop a node address from every pod's policy.
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	skip, err := vipLinks()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.IPNet == nil || slices.Contains(skip, a.LinkIndex) {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsGlobalUnicast() && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// vipLinks are the indexes of the namespace's vipDevices. Read after the
// addresses: a device made in between has none of its addresses in that
// dump.
func vipLinks() ([]int, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing the node's interfaces: %w", err)
	}
	var idx []int
	for _, ifc := range ifaces {
		if slices.Contains(vipDevices, ifc.Name) {
			idx = append(idx, ifc.Index)
		}
	}
	return idx, nil
}
