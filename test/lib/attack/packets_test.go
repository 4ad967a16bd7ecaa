package attack

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestPacketsParse: what the builders write, Parse reads back, with
// checksums a receiver accepts.
func TestPacketsParse(t *testing.T) {
	payload := []byte("m/egress/eth0/udp4")
	for _, c := range []struct {
		name     string
		src, dst netip.AddrPort
		build    func(src, dst netip.AddrPort, p []byte) []byte
		proto    uint8
	}{
		{"udp4", netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.0.0.3:5001"), UDPPacket, protoUDP},
		{"udp6", netip.MustParseAddrPort("[fd00::2]:40000"), netip.MustParseAddrPort("[fd00::3]:5001"), UDPPacket, protoUDP},
		{"syn4", netip.MustParseAddrPort("10.0.0.2:40001"), netip.MustParseAddrPort("10.0.0.3:5002"), SYNPacket, protoTCP},
		{"syn6", netip.MustParseAddrPort("[fd00::2]:40001"), netip.MustParseAddrPort("[fd00::3]:5002"), SYNPacket, protoTCP},
	} {
		pkt := c.build(c.src, c.dst, payload)
		seg, ok := Parse(EtherType(pkt), pkt)
		if !ok || seg.Src != c.src || seg.Dst != c.dst || seg.Proto != c.proto || string(seg.Payload) != string(payload) {
			t.Errorf("%s: parsed %+v (%v), want %s -> %s proto %d payload %q", c.name, seg, ok, c.src, c.dst, c.proto, payload)
		}
		if !l4ChecksumOK(pkt) {
			t.Errorf("%s: bad transport checksum", c.name)
		}
		if c.src.Addr().Is4() && !header.IPv4(pkt).IsChecksumValid() {
			t.Errorf("%s: bad IPv4 header checksum", c.name)
		}
		// The answer a victim would send is recognised as one.
		flags := header.TCPFlags(0)
		if c.proto == protoTCP {
			flags = header.TCPFlagSyn | header.TCPFlagAck
		}
		if !(Segment{Src: c.dst, Dst: c.src, Proto: c.proto, Flags: flags}).IsAnswer(c.proto, c.src, c.dst) {
			t.Errorf("%s: the answer is not recognised", c.name)
		}
		for _, f := range []header.TCPFlags{header.TCPFlagAck, header.TCPFlagRst | header.TCPFlagAck} {
			if c.proto == protoTCP && (Segment{Src: c.dst, Dst: c.src, Proto: c.proto, Flags: f}).IsAnswer(protoTCP, c.src, c.dst) {
				t.Errorf("%s: %s taken for an answer to a SYN", c.name, f)
			}
		}
	}
}

func l4ChecksumOK(pkt []byte) bool {
	var src, dst tcpip.Address
	var l4 []byte
	var proto tcpip.TransportProtocolNumber
	if pkt[0]>>4 == 4 {
		ip := header.IPv4(pkt)
		src, dst, proto, l4 = ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol(), ip.Payload()
	} else {
		ip := header.IPv6(pkt)
		src, dst, proto, l4 = ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol(), ip.Payload()
	}
	xsum := header.PseudoHeaderChecksum(proto, src, dst, uint16(len(l4)))
	return checksum.Checksum(l4, xsum) == 0xffff
}

// TestNeighbourMessages: ARP and NDP messages are what a receiver takes
// for valid ones.
func TestNeighbourMessages(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	victim := Pair{V4: netip.MustParseAddr("10.0.0.3"), V6: netip.MustParseAddr("fd00::3")}
	node := Pair{V4: netip.MustParseAddr("10.0.0.1"), V6: netip.MustParseAddr("fd00::1")}
	ms := neighMsgs(victim, node, mac, Broadcast)
	if len(ms) != 7 {
		t.Fatalf("got %d messages, want 7", len(ms))
	}
	for i, m := range ms {
		if m.name != NeighCases[i] {
			t.Errorf("message %d: %s, want %s (NeighCases)", i, m.name, NeighCases[i])
		}
		switch tcpip.NetworkProtocolNumber(m.etherType) {
		case header.ARPProtocolNumber:
			a := header.ARP(m.payload)
			if !a.IsValid() || !slices.Equal(a.HardwareAddressSender(), mac) || netip.AddrFrom4([4]byte(a.ProtocolAddressSender())) != victim.V4 {
				t.Errorf("%s: ARP %x does not claim %s at %s", m.name, m.payload, victim.V4, mac)
			}
		case header.IPv6ProtocolNumber:
			ip := header.IPv6(m.payload)
			if ip.HopLimit() != 255 || ip.TransportProtocol() != header.ICMPv6ProtocolNumber {
				t.Errorf("%s: hop limit %d, protocol %d", m.name, ip.HopLimit(), ip.TransportProtocol())
			}
			if !l4ChecksumOK(m.payload) {
				t.Errorf("%s: bad ICMPv6 checksum", m.name)
			}
		default:
			t.Errorf("%s: EtherType %#x", m.name, m.etherType)
		}
	}
}

func TestMarkers(t *testing.T) {
	b := []byte("xx base1/egress/eth0/udp4\x00yy base1/spoof/rawsock/syn6 base1/egress/eth0/udp4 base2/no")
	got := Markers(b, "base1")
	want := []string{"base1/egress/eth0/udp4", "base1/spoof/rawsock/syn6"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestCapMask(t *testing.T) {
	m, err := CapMask("CAP_NET_RAW", "net_admin")
	if err != nil || m != 1<<13|1<<12 {
		t.Errorf("got %#x %v, want %#x", m, err, 1<<13|1<<12)
	}
	if got := CapList(m); !slices.Equal(got, []string{"net_admin", "net_raw"}) {
		t.Errorf("got %v", got)
	}
	if _, err := CapMask("sys_everything"); err == nil {
		t.Error("an unknown capability accepted")
	}
}
