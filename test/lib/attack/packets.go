package attack

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Broadcast is the Ethernet broadcast address.
var Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func addr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

// ipPacket wraps an L4 segment in an IPv4 or IPv6 header from src to dst.
func ipPacket(src, dst netip.Addr, proto tcpip.TransportProtocolNumber, l4 []byte) []byte {
	if src.Is4() {
		b := make([]byte, header.IPv4MinimumSize+len(l4))
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)),
			ID:          uint16(rand.Uint32()),
			TTL:         64,
			Protocol:    uint8(proto),
			SrcAddr:     addr(src),
			DstAddr:     addr(dst),
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		copy(b[header.IPv4MinimumSize:], l4)
		return b
	}
	b := make([]byte, header.IPv6MinimumSize+len(l4))
	header.IPv6(b).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(len(l4)),
		TransportProtocol: proto,
		HopLimit:          64,
		SrcAddr:           addr(src),
		DstAddr:           addr(dst),
	})
	copy(b[header.IPv6MinimumSize:], l4)
	return b
}

// UDPPacket is an IP packet holding one UDP datagram from src to dst.
func UDPPacket(src, dst netip.AddrPort, payload []byte) []byte {
	l4 := make([]byte, header.UDPMinimumSize+len(payload))
	u := header.UDP(l4)
	u.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(l4))})
	copy(l4[header.UDPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, addr(src.Addr()), addr(dst.Addr()), uint16(len(l4)))
	xsum = checksum.Checksum(payload, xsum)
	u.SetChecksum(^u.CalculateChecksum(xsum))
	return ipPacket(src.Addr(), dst.Addr(), header.UDPProtocolNumber, l4)
}

// SYNPacket is an IP packet holding a TCP SYN from src to dst that carries
// payload (data on a SYN is legal; a receiver that does not take it
// acknowledges the SYN alone, and the marker is there to be found on the
// way).
func SYNPacket(src, dst netip.AddrPort, payload []byte) []byte {
	l4 := make([]byte, header.TCPMinimumSize+len(payload))
	t := header.TCP(l4)
	t.Encode(&header.TCPFields{
		SrcPort:    src.Port(),
		DstPort:    dst.Port(),
		SeqNum:     rand.Uint32(),
		DataOffset: header.TCPMinimumSize,
		Flags:      header.TCPFlagSyn,
		WindowSize: 64240,
	})
	copy(l4[header.TCPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, addr(src.Addr()), addr(dst.Addr()), uint16(len(l4)))
	xsum = checksum.Checksum(payload, xsum)
	t.SetChecksum(^t.CalculateChecksum(xsum))
	return ipPacket(src.Addr(), dst.Addr(), header.TCPProtocolNumber, l4)
}

// EtherType is the Ethernet type of an IP packet.
func EtherType(ip []byte) uint16 {
	if len(ip) > 0 && ip[0]>>4 == 6 {
		return uint16(header.IPv6ProtocolNumber)
	}
	return uint16(header.IPv4ProtocolNumber)
}

// Frame puts payload in an Ethernet frame.
func Frame(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	b := make([]byte, header.EthernetMinimumSize+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
	copy(b[header.EthernetMinimumSize:], payload)
	return b
}

// ARPPacket is an ARP message for IPv4 over Ethernet.
func ARPPacket(op header.ARPOp, senderMAC net.HardwareAddr, sender netip.Addr, targetMAC net.HardwareAddr, target netip.Addr) []byte {
	b := make([]byte, header.ARPSize)
	a := header.ARP(b)
	a.SetIPv4OverEthernet()
	a.SetOp(op)
	copy(a.HardwareAddressSender(), senderMAC)
	s4, t4 := sender.As4(), target.As4()
	copy(a.ProtocolAddressSender(), s4[:])
	copy(a.HardwareAddressTarget(), targetMAC)
	copy(a.ProtocolAddressTarget(), t4[:])
	return b
}

// ndpOption is a link-layer address option (kind 1: source, 2: target).
func ndpOption(kind byte, mac net.HardwareAddr) []byte {
	return append([]byte{kind, 1}, mac...)
}

// NAPacket is an IPv6 packet holding a neighbour advertisement from src
// to dst saying that target is at mac.
func NAPacket(src, dst, target netip.Addr, mac net.HardwareAddr, solicited, override bool) []byte {
	b := make([]byte, header.ICMPv6NeighborAdvertMinimumSize+8)
	icmp := header.ICMPv6(b)
	icmp.SetType(header.ICMPv6NeighborAdvert)
	na := header.NDPNeighborAdvert(icmp.MessageBody())
	na.SetSolicitedFlag(solicited)
	na.SetOverrideFlag(override)
	na.SetTargetAddress(addr(target))
	copy(b[header.ICMPv6NeighborAdvertMinimumSize:], ndpOption(2, mac))
	icmp.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: icmp, Src: addr(src), Dst: addr(dst)}))
	return ndpPacket(src, dst, b)
}

// NSPacket is an IPv6 packet holding a neighbour solicitation for target
// from src, which says src is at mac: the solicited node learns it.
func NSPacket(src, dst, target netip.Addr, mac net.HardwareAddr) []byte {
	b := make([]byte, header.ICMPv6NeighborSolicitMinimumSize+8)
	icmp := header.ICMPv6(b)
	icmp.SetType(header.ICMPv6NeighborSolicit)
	header.NDPNeighborSolicit(icmp.MessageBody()).SetTargetAddress(addr(target))
	copy(b[header.ICMPv6NeighborSolicitMinimumSize:], ndpOption(1, mac))
	icmp.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: icmp, Src: addr(src), Dst: addr(dst)}))
	return ndpPacket(src, dst, b)
}

// ndpPacket is an ICMPv6 message in an IPv6 header with hop limit 255,
// which NDP requires (a message with less is from off-link: ignored).
func ndpPacket(src, dst netip.Addr, icmp []byte) []byte {
	b := make([]byte, header.IPv6MinimumSize+len(icmp))
	header.IPv6(b).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(len(icmp)),
		TransportProtocol: header.ICMPv6ProtocolNumber,
		HopLimit:          header.NDPHopLimit,
		SrcAddr:           addr(src),
		DstAddr:           addr(dst),
	})
	copy(b[header.IPv6MinimumSize:], icmp)
	return b
}

// AllNodes is ff02::1.
var AllNodes = netip.MustParseAddr("ff02::1")

// SolicitedNode is the solicited-node multicast address of a.
func SolicitedNode(a netip.Addr) netip.Addr {
	return netip.AddrFrom16(header.SolicitedNodeAddr(addr(a)).As16())
}

// MulticastMAC is the Ethernet address of an IPv6 multicast address.
func MulticastMAC(a netip.Addr) net.HardwareAddr {
	return net.HardwareAddr(header.EthernetAddressFromMulticastIPv6Address(addr(a)))
}

// Segment is what Parse reads of an IP packet: its addresses and, for UDP
// and TCP, ports (and TCP's flags); ARP is Proto 0 with the sender's
// address in Src.
type Segment struct {
	Src, Dst netip.AddrPort
	Proto    uint8
	Flags    header.TCPFlags
	Payload  []byte
}

// Parse reads an IPv4 or IPv6 packet (no extension headers) or, when
// etherType says so, an ARP message. ok is false for anything else.
func Parse(etherType uint16, b []byte) (s Segment, ok bool) {
	switch tcpip.NetworkProtocolNumber(etherType) {
	case header.ARPProtocolNumber:
		a := header.ARP(b)
		if len(b) < header.ARPSize || !a.IsValid() {
			return s, false
		}
		src, _ := netip.AddrFromSlice(a.ProtocolAddressSender())
		dst, _ := netip.AddrFromSlice(a.ProtocolAddressTarget())
		return Segment{Src: netip.AddrPortFrom(src, 0), Dst: netip.AddrPortFrom(dst, 0), Flags: header.TCPFlags(a.Op())}, true
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(b)
		if len(b) < header.IPv4MinimumSize || !ip.IsValid(len(b)) || ip.FragmentOffset() != 0 {
			return s, false
		}
		s.Src = netip.AddrPortFrom(netip.AddrFrom4(ip.SourceAddress().As4()), 0)
		s.Dst = netip.AddrPortFrom(netip.AddrFrom4(ip.DestinationAddress().As4()), 0)
		s.Proto = ip.Protocol()
		b = b[ip.HeaderLength():min(len(b), int(ip.TotalLength()))]
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(b)
		if len(b) < header.IPv6MinimumSize || !ip.IsValid(len(b)) {
			return s, false
		}
		s.Src = netip.AddrPortFrom(netip.AddrFrom16(ip.SourceAddress().As16()), 0)
		s.Dst = netip.AddrPortFrom(netip.AddrFrom16(ip.DestinationAddress().As16()), 0)
		s.Proto = ip.NextHeader()
		b = b[header.IPv6MinimumSize:min(len(b), header.IPv6MinimumSize+int(ip.PayloadLength()))]
	default:
		return s, false
	}
	switch tcpip.TransportProtocolNumber(s.Proto) {
	case header.UDPProtocolNumber:
		if len(b) < header.UDPMinimumSize {
			return s, true
		}
		u := header.UDP(b)
		s.Src, s.Dst = netip.AddrPortFrom(s.Src.Addr(), u.SourcePort()), netip.AddrPortFrom(s.Dst.Addr(), u.DestinationPort())
		s.Payload = b[header.UDPMinimumSize:]
	case header.TCPProtocolNumber:
		if len(b) < header.TCPMinimumSize {
			return s, true
		}
		t := header.TCP(b)
		s.Src, s.Dst = netip.AddrPortFrom(s.Src.Addr(), t.SourcePort()), netip.AddrPortFrom(s.Dst.Addr(), t.DestinationPort())
		s.Flags = t.Flags()
		if off := int(t.DataOffset()); off >= header.TCPMinimumSize && off <= len(b) {
			s.Payload = b[off:]
		}
	default:
		s.Payload = b
	}
	return s, true
}

// Kind names the segment: "UDP", "SYN", "SYN-ACK", "RST", "TCP" (any
// other TCP segment), or the protocol number.
func (s Segment) Kind() string {
	switch tcpip.TransportProtocolNumber(s.Proto) {
	case header.UDPProtocolNumber:
		return "UDP"
	case header.TCPProtocolNumber:
		switch {
		case s.Flags.Contains(header.TCPFlagRst):
			return "RST"
		case s.Flags.Contains(header.TCPFlagSyn | header.TCPFlagAck):
			return "SYN-ACK"
		case s.Flags.Contains(header.TCPFlagSyn):
			return "SYN"
		}
		return "TCP"
	}
	return fmt.Sprintf("protocol %d", s.Proto)
}

// IsAnswer says whether s answers a packet sent from src to dst: UDP from
// dst to src, or, to a SYN, a SYN-ACK. (Not a RST: a pod's own stack
// answers with one an application's SYN it could not relay, which says
// nothing of the remote.)
func (s Segment) IsAnswer(proto uint8, src, dst netip.AddrPort) bool {
	if s.Proto != proto || s.Src != dst || s.Dst != src {
		return false
	}
	if tcpip.TransportProtocolNumber(proto) == header.TCPProtocolNumber {
		return s.Kind() == "SYN-ACK"
	}
	return true
}
