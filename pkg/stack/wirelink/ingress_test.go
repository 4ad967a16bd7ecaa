package wirelink

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

var (
	allowedV4 = netip.MustParseAddr("10.1.0.5")
	deniedV4  = netip.MustParseAddr("10.2.0.5")
	allowedV6 = netip.MustParseAddr("fd01::5")
	deniedV6  = netip.MustParseAddr("fd02::5")
	podV4     = netip.MustParseAddr("10.9.0.2")
	podV6     = netip.MustParseAddr("fd09::2")
)

// ipv4Packet is an IPv4 packet from src to the pod carrying l4.
func ipv4Packet(src netip.Addr, proto uint8, flags uint8, fragOff uint16, l4 []byte) []byte {
	b := make([]byte, header.IPv4MinimumSize+len(l4))
	header.IPv4(b).Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), Flags: flags, FragmentOffset: fragOff, TTL: 64,
		Protocol: proto, SrcAddr: tcpip.AddrFrom4(src.As4()), DstAddr: tcpip.AddrFrom4(podV4.As4())})
	copy(b[header.IPv4MinimumSize:], l4)
	return b
}

// ipv6Packet is an IPv6 packet from src to the pod: ext are extension
// headers (each next-header byte first, already linked), next the first
// header's identifier.
func ipv6Packet(src netip.Addr, next uint8, ext, l4 []byte) []byte {
	b := make([]byte, header.IPv6MinimumSize+len(ext)+len(l4))
	header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: uint16(len(ext) + len(l4)), TransportProtocol: tcpip.TransportProtocolNumber(next),
		HopLimit: 64, SrcAddr: tcpip.AddrFrom16(src.As16()), DstAddr: tcpip.AddrFrom16(podV6.As16())})
	copy(b[header.IPv6MinimumSize:], ext)
	copy(b[header.IPv6MinimumSize+len(ext):], l4)
	return b
}

func tcpSeg(port uint16, flags header.TCPFlags) []byte {
	b := make([]byte, header.TCPMinimumSize)
	header.TCP(b).Encode(&header.TCPFields{SrcPort: 40000, DstPort: port, DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 1000})
	return b
}

// optHeader is an 8-byte options extension header followed by next.
func optHeader(next uint8) []byte { return []byte{next, 0, 1, 4, 0, 0, 0, 0} }

// fragHeader is an IPv6 fragment header at offset (8-byte units).
func fragHeader(next uint8, offset uint16, more bool) []byte {
	b := []byte{next, 0, 0, 0, 0, 0, 0, 7}
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(b[2:], fo)
	return b
}

func TestAdmitIngress(t *testing.T) {
	allowPeer := policy.Rule{Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.1.0.0/16")}, {CIDR: netip.MustParsePrefix("fd01::/16")}},
		Ports: []policy.PortRange{{Protocol: policy.TCP, First: 80}}}
	e, err := enforce.NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion,
		Ingress: policy.Direction{Isolated: true, Policies: []string{"ns/p"}, Rules: []policy.Rule{allowPeer}}})
	if err != nil {
		t.Fatal(err)
	}
	m := e.For(policy.Ingress)
	v4 := header.IPv4ProtocolNumber
	v6 := header.IPv6ProtocolNumber
	const (
		tcp   = policy.ProtoTCP
		udp   = policy.ProtoUDP
		icmp  = policy.ProtoICMP
		icmp6 = policy.ProtoICMPv6
	)
	syn, ack := header.TCPFlagSyn, header.TCPFlagAck
	hbh, dst, frag := uint8(header.IPv6HopByHopOptionsExtHdrIdentifier), uint8(header.IPv6DestinationOptionsExtHdrIdentifier), uint8(header.IPv6FragmentExtHdrIdentifier)
	var chain []byte
	for range maxExtHeaders {
		chain = append(chain, optHeader(dst)...)
	}
	chain[len(chain)-8] = tcp
	for _, c := range []struct {
		name   string
		proto  tcpip.NetworkProtocolNumber
		packet []byte
		want   bool
	}{
		{"v4 SYN allowed peer and port", v4, ipv4Packet(allowedV4, tcp, 0, 0, tcpSeg(80, syn)), true},
		{"v4 SYN allowed peer, other port", v4, ipv4Packet(allowedV4, tcp, 0, 0, tcpSeg(81, syn)), false},
		{"v4 SYN denied peer", v4, ipv4Packet(deniedV4, tcp, 0, 0, tcpSeg(80, syn)), false},
		{"v4 SYN-ACK denied peer (a reply)", v4, ipv4Packet(deniedV4, tcp, 0, 0, tcpSeg(80, syn|ack)), true},
		{"v4 ACK denied peer (established)", v4, ipv4Packet(deniedV4, tcp, 0, 0, tcpSeg(80, ack)), true},
		{"v4 first fragment with ACK, denied peer", v4, ipv4Packet(deniedV4, tcp, header.IPv4FlagMoreFragments, 0, tcpSeg(80, ack)), false},
		{"v4 first fragment, allowed", v4, ipv4Packet(allowedV4, tcp, header.IPv4FlagMoreFragments, 0, tcpSeg(80, ack)), true},
		{"v4 tiny first fragment", v4, ipv4Packet(allowedV4, tcp, header.IPv4FlagMoreFragments, 0, []byte{1, 2}), false},
		{"v4 later fragment", v4, ipv4Packet(deniedV4, tcp, 0, 8, tcpSeg(80, syn)), true},
		{"v4 UDP (the relay decides)", v4, ipv4Packet(deniedV4, udp, 0, 0, make([]byte, 8)), true},
		{"v4 echo request denied", v4, ipv4Packet(deniedV4, icmp, 0, 0, []byte{8, 0, 0, 0, 0, 1, 0, 1}), false},
		{"v4 echo request allowed peer, no rule without ports", v4, ipv4Packet(allowedV4, icmp, 0, 0, []byte{8, 0, 0, 0, 0, 1, 0, 1}), false},
		{"v4 echo reply", v4, ipv4Packet(deniedV4, icmp, 0, 0, []byte{0, 0, 0, 0, 0, 1, 0, 1}), true},
		{"v4 unreachable", v4, ipv4Packet(deniedV4, icmp, 0, 0, []byte{3, 3, 0, 0, 0, 0, 0, 0}), true},
		{"v4 truncated", v4, ipv4Packet(deniedV4, tcp, 0, 0, nil)[:10], true},
		{"v6 SYN allowed", v6, ipv6Packet(allowedV6, tcp, nil, tcpSeg(80, syn)), true},
		{"v6 SYN denied", v6, ipv6Packet(deniedV6, tcp, nil, tcpSeg(80, syn)), false},
		{"v6 SYN denied behind options", v6, ipv6Packet(deniedV6, hbh, append(optHeader(dst), optHeader(tcp)...), tcpSeg(80, syn)), false},
		{"v6 SYN allowed behind options", v6, ipv6Packet(allowedV6, hbh, optHeader(tcp), tcpSeg(80, syn)), true},
		{"v6 first fragment with ACK, denied", v6, ipv6Packet(deniedV6, frag, fragHeader(tcp, 0, true), tcpSeg(80, ack)), false},
		{"v6 later fragment", v6, ipv6Packet(deniedV6, frag, fragHeader(tcp, 2, false), tcpSeg(80, syn)), true},
		{"v6 atomic fragment SYN denied", v6, ipv6Packet(deniedV6, frag, fragHeader(tcp, 0, false), tcpSeg(80, syn)), false},
		{"v6 atomic fragment ACK", v6, ipv6Packet(deniedV6, frag, fragHeader(tcp, 0, false), tcpSeg(80, ack)), true},
		{"v6 too many extension headers", v6, ipv6Packet(allowedV6, dst, chain, tcpSeg(80, syn)), false},
		{"v6 echo request denied", v6, ipv6Packet(deniedV6, icmp6, nil, []byte{128, 0, 0, 0, 0, 1, 0, 1}), false},
		{"v6 neighbour solicitation", v6, ipv6Packet(deniedV6, icmp6, nil, make([]byte, 24)), true},
		{"v6 echo reply", v6, ipv6Packet(deniedV6, icmp6, nil, []byte{129, 0, 0, 0, 0, 1, 0, 1}), true},
		{"ARP", header.ARPProtocolNumber, make([]byte, 28), true},
	} {
		if c.name == "v6 neighbour solicitation" {
			c.packet[header.IPv6MinimumSize] = 135
		}
		if got := admitIngress(m, c.proto, frameHeaders(c.packet)); got != c.want {
			t.Errorf("%s (frame bytes): got %v, want %v", c.name, got, c.want)
		}
		pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData(c.packet)})
		if got := admitIngress(m, c.proto, pktHeaders{pkt}); got != c.want {
			t.Errorf("%s (packet buffer): got %v, want %v", c.name, got, c.want)
		}
		pkt.DecRef()
	}
	if n := e.Status().Denied.Ingress["ns/p"]; n == 0 {
		t.Error("no denial counted")
	}
}

// FuzzAdmitIngress feeds arbitrary IP packets to the ingress verdict of an
// isolated pod: it must not crash, and must judge the bytes of a frame and
// the same bytes in a packet buffer alike.
func FuzzAdmitIngress(f *testing.F) {
	f.Add(uint16(header.IPv4ProtocolNumber), ipv4Packet(deniedV4, policy.ProtoTCP, 0, 0, tcpSeg(80, header.TCPFlagSyn)))
	f.Add(uint16(header.IPv4ProtocolNumber), ipv4Packet(deniedV4, policy.ProtoTCP, header.IPv4FlagMoreFragments, 0, []byte{1}))
	f.Add(uint16(header.IPv6ProtocolNumber), ipv6Packet(deniedV6, uint8(header.IPv6FragmentExtHdrIdentifier), fragHeader(policy.ProtoTCP, 0, true), tcpSeg(80, 0)))
	f.Add(uint16(header.IPv6ProtocolNumber), ipv6Packet(deniedV6, uint8(header.IPv6HopByHopOptionsExtHdrIdentifier), optHeader(policy.ProtoICMPv6), []byte{128, 0}))
	e, err := enforce.NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion,
		Ingress: policy.Direction{Isolated: true, Rules: []policy.Rule{{Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.1.0.0/16")}},
			Ports: []policy.PortRange{{Protocol: policy.TCP, First: 80}}}}}})
	if err != nil {
		f.Fatal(err)
	}
	m := e.For(policy.Ingress)
	f.Fuzz(func(t *testing.T, proto uint16, packet []byte) {
		p := tcpip.NetworkProtocolNumber(proto)
		got := admitIngress(m, p, frameHeaders(packet))
		pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData(packet)})
		defer pkt.DecRef()
		if again := admitIngress(m, p, pktHeaders{pkt}); again != got {
			t.Fatalf("frame bytes: %v, packet buffer: %v", got, again)
		}
	})
}

// TestAdmitIngressRecords: the wire leg's denials carry the peer, the
// pod's address and port, and why: no rule, or a packet that cannot be
// judged.
func TestAdmitIngressRecords(t *testing.T) {
	e, err := enforce.NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion, Generation: 3,
		Ingress: policy.Direction{Isolated: true, Policies: []string{"ns/p"}}})
	if err != nil {
		t.Fatal(err)
	}
	m := e.For(policy.Ingress)
	dst := uint8(header.IPv6DestinationOptionsExtHdrIdentifier)
	var chain []byte
	for range maxExtHeaders {
		chain = append(chain, optHeader(dst)...)
	}
	for _, c := range []struct {
		proto  tcpip.NetworkProtocolNumber
		packet []byte
	}{
		{header.IPv4ProtocolNumber, ipv4Packet(deniedV4, policy.ProtoTCP, 0, 0, tcpSeg(8080, header.TCPFlagSyn))},
		{header.IPv4ProtocolNumber, ipv4Packet(deniedV4, policy.ProtoTCP, header.IPv4FlagMoreFragments, 0, []byte{1, 2})},
		{header.IPv6ProtocolNumber, ipv6Packet(deniedV6, dst, chain, tcpSeg(80, header.TCPFlagSyn))},
		{header.IPv6ProtocolNumber, ipv6Packet(deniedV6, policy.ProtoICMPv6, nil, []byte{128, 0, 0, 0, 0, 1, 0, 1})},
	} {
		if admitIngress(m, c.proto, frameHeaders(c.packet)) {
			t.Fatalf("admitted % x", c.packet)
		}
	}
	want := []policy.Denial{
		{Direction: "ingress", Protocol: "TCP", Peer: deniedV4, Port: 8080, Local: podV4, Layer: policy.TierNetworkPolicy, Policies: "ns/p", Reason: "no rule admits", Generation: 3},
		{Direction: "ingress", Protocol: "TCP", Peer: deniedV4, Local: podV4, Policies: "ns/p", Reason: "first fragment without ports", Generation: 3},
		{Direction: "ingress", Protocol: "60", Peer: deniedV6, Local: podV6, Policies: "ns/p", Reason: "too many extension headers", Generation: 3},
		{Direction: "ingress", Protocol: "ICMPv6", Peer: deniedV6, Local: podV6, Layer: policy.TierNetworkPolicy, Policies: "ns/p", Reason: "no rule admits", Generation: 3},
	}
	got := e.Status().RecentDenials
	if len(got) != len(want) {
		t.Fatalf("recent denials: got %d, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		got[i].Time = want[i].Time
		if got[i] != want[i] {
			t.Errorf("denial %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}
