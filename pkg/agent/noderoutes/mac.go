package noderoutes

import (
	"crypto/sha256"
	"net"
	"net/netip"
)

// macOf is the MAC of the VXLAN device of the node whose InternalIP is
// ip. Every node derives every peer's MAC from the peer's address, so
// that no node has to publish its own (no Node annotation, no RBAC to
// write one). IPv4: 0a:58 and the address's four bytes, as OVN-Kubernetes
// derives its MACs. IPv6: a locally administered unicast MAC from a hash
// of the address (the address is longer than a MAC).
func macOf(ip netip.Addr) net.HardwareAddr {
	ip = ip.Unmap()
	if ip.Is4() {
		b := ip.As4()
		return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
	}
	b := ip.As16()
	h := sha256.Sum256(b[:])
	mac := net.HardwareAddr(h[:6:6])
	mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	return mac
}
