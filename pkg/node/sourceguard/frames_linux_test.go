package sourceguard

import (
	"encoding/binary"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Frame builders for the root tests: just enough Ethernet, IPv4, IPv6,
// UDP, ARP and ICMPv6 to send what a pod (or a subverted one) would.

var (
	broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	allNodesMAC  = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	allNodes     = netip.MustParseAddr("ff02::1")
	allRouters   = netip.MustParseAddr("ff02::2")
)

func ether(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
	return append(b, payload...)
}

// vlanTagged is ether with an 802.1Q tag for vid in front of etherType.
func vlanTagged(dst, src net.HardwareAddr, vid, etherType uint16, payload []byte) []byte {
	tag := make([]byte, 4, 4+len(payload))
	binary.BigEndian.PutUint16(tag[0:2], vid)
	binary.BigEndian.PutUint16(tag[2:4], etherType)
	return ether(dst, src, unix.ETH_P_8021Q, append(tag, payload...))
}

// checksum is the Internet checksum (RFC 1071) of b, continuing sum.
func checksum(b []byte, sum uint32) uint16 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// pseudoSum is the unfolded sum of the IPv4 or IPv6 pseudo-header.
func pseudoSum(src, dst netip.Addr, proto byte, length int) uint32 {
	var sum uint32
	for _, a := range [][]byte{src.AsSlice(), dst.AsSlice()} {
		for i := 0; i < len(a); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(a[i:]))
		}
	}
	return sum + uint32(proto) + uint32(length)
}

func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:4], uint16(20+len(payload)))
	h[8] = 64
	h[9] = proto
	copy(h[12:16], src.AsSlice())
	copy(h[16:20], dst.AsSlice())
	binary.BigEndian.PutUint16(h[10:12], checksum(h, 0))
	return append(h, payload...)
}

// ipv6 is an IPv6 packet; ext, when not nil, is one extension header
// (with its next header field already set) between the fixed header and
// payload, and next is then the extension header's type.
func ipv6(src, dst netip.Addr, next, hopLimit byte, ext, payload []byte) []byte {
	h := make([]byte, 40, 40+len(ext)+len(payload))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:6], uint16(len(ext)+len(payload)))
	h[6] = next
	h[7] = hopLimit
	copy(h[8:24], src.AsSlice())
	copy(h[24:40], dst.AsSlice())
	return append(append(h, ext...), payload...)
}

func udp(src, dst netip.Addr, srcPort, dstPort uint16, data []byte) []byte {
	u := make([]byte, 8, 8+len(data))
	binary.BigEndian.PutUint16(u[0:2], srcPort)
	binary.BigEndian.PutUint16(u[2:4], dstPort)
	binary.BigEndian.PutUint16(u[4:6], uint16(8+len(data)))
	u = append(u, data...)
	c := checksum(u, pseudoSum(src, dst, unix.IPPROTO_UDP, len(u)))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:8], c)
	return u
}

// udpFrame is a whole Ethernet frame carrying a UDP datagram.
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, port uint16, data string) []byte {
	u := udp(src, dst, 40000, port, []byte(data))
	if src.Is4() {
		return ether(dstMAC, srcMAC, unix.ETH_P_IP, ipv4(src, dst, unix.IPPROTO_UDP, u))
	}
	return ether(dstMAC, srcMAC, unix.ETH_P_IPV6, ipv6(src, dst, unix.IPPROTO_UDP, 64, nil, u))
}

const (
	arpRequest = 1
	arpReply   = 2
)

func arp(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:2], 1)
	binary.BigEndian.PutUint16(b[2:4], unix.ETH_P_IP)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], op)
	copy(b[8:14], sha)
	copy(b[14:18], spa.AsSlice())
	copy(b[18:24], tha)
	copy(b[24:28], tpa.AsSlice())
	return b
}

// icmpv6 is an ICMPv6 message with its checksum.
func icmpv6(src, dst netip.Addr, typ, code byte, body []byte) []byte {
	m := append([]byte{typ, code, 0, 0}, body...)
	binary.BigEndian.PutUint16(m[2:4], checksum(m, pseudoSum(src, dst, unix.IPPROTO_ICMPV6, len(m))))
	return m
}

// NDP option types (RFC 4861, RFC 7527).
const (
	optSource = 1
	optTarget = 2
	optNonce  = 14
)

// ndOpt is an 8-byte NDP option: a link-layer address or a nonce.
func ndOpt(typ byte, six []byte) []byte {
	return append([]byte{typ, 1}, six...)
}

// nd is a neighbour solicitation (135) or advertisement (136) for target,
// as a whole frame; flags are the advertisement's R, S and O bits in the
// first byte.
func nd(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, typ, flags byte, target netip.Addr, opts ...[]byte) []byte {
	body := append([]byte{flags, 0, 0, 0}, target.AsSlice()...)
	for _, o := range opts {
		body = append(body, o...)
	}
	return ether(dstMAC, srcMAC, unix.ETH_P_IPV6, ipv6(src, dst, unix.IPPROTO_ICMPV6, 255, nil, icmpv6(src, dst, typ, 0, body)))
}

// naOverride is the O flag of a neighbour advertisement: replace the
// cached link-layer address.
const naOverride = 0x20
