package policyctl

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// nodeAddrs are the global unicast addresses of the agent's network
// namespace: the node's, since the agent runs in the host network. They
// include the node ends of the pods' veths (the gateways), the sources of
// the node's own connections to its pods.
func nodeAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
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
