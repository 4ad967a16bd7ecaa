package wirelink

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// The ingress verdict on the wire leg (docs/policy.md, "Where the stack
// takes the verdict"): a packet from the network that would open a
// connection netstack serves without asking the relay first — a TCP SYN
// (the mirrored listeners and the SYN cookie paths answer it) or an ICMP
// echo request (netstack answers it) — is dropped, silently, when the
// pod's ingress policy denies its source. Everything else passes: the
// replies of the pod's own connections, segments of established ones, UDP
// (the relay's forwarder decides, once reassembled).
//
// IP fragments are judged by their first fragment, the only one that
// carries the transport header's ports: a non-first fragment passes (it
// never reassembles without a first one), and a first fragment of TCP is
// judged whatever its flags say, since a later fragment may rewrite them.

// headerSource gives the first n bytes of a packet, network header first.
type headerSource interface {
	pull(n int) ([]byte, bool)
}

// pktHeaders pulls from a packet buffer (the link's readers).
type pktHeaders struct{ pkt *tcpipstack.PacketBuffer }

func (s pktHeaders) pull(n int) ([]byte, bool) { return s.pkt.Data().PullUp(n) }

// frameHeaders pulls from the bytes of a frame (synPath's ring).
type frameHeaders []byte

func (s frameHeaders) pull(n int) ([]byte, bool) {
	if n > len(s) {
		return nil, false
	}
	return s[:n], true
}

// maxExtHeaders bounds the IPv6 extension headers walked to the transport
// header: no legitimate packet has more, and a packet that does is
// dropped by an isolated pod rather than judged on a guess.
const maxExtHeaders = 8

// admitIngress reports whether a packet of network protocol proto may
// reach netstack under m, counting a denial.
func admitIngress[S headerSource](m *policy.Matcher, proto tcpip.NetworkProtocolNumber, s S) bool {
	var (
		src, dst netip.Addr
		l4       uint8
		off      int  // of the transport header
		frag     bool // the first fragment of a larger packet
	)
	switch proto {
	case header.IPv4ProtocolNumber:
		h, ok := s.pull(header.IPv4MinimumSize)
		if !ok {
			return true // netstack drops it as malformed
		}
		ip := header.IPv4(h)
		if ip.FragmentOffset() != 0 {
			return true
		}
		src, dst = netip.AddrFrom4([4]byte(h[12:16])), netip.AddrFrom4([4]byte(h[16:20]))
		l4, off, frag = ip.Protocol(), int(ip.HeaderLength()), ip.More()
		if off < header.IPv4MinimumSize {
			return true
		}
	case header.IPv6ProtocolNumber:
		h, ok := s.pull(header.IPv6MinimumSize)
		if !ok {
			return true
		}
		src, dst = netip.AddrFrom16([16]byte(h[8:24])), netip.AddrFrom16([16]byte(h[24:40]))
		l4, off = h[6], header.IPv6MinimumSize
		for n := 0; ; n++ {
			if n == maxExtHeaders {
				m.Deny(policy.Flow{Dir: policy.Ingress, Proto: l4, Peer: src, Local: dst}, policy.TooManyHeaders)
				return false
			}
			switch header.IPv6ExtensionHeaderIdentifier(l4) {
			case header.IPv6HopByHopOptionsExtHdrIdentifier, header.IPv6RoutingExtHdrIdentifier, header.IPv6DestinationOptionsExtHdrIdentifier:
				e, ok := s.pull(off + 2)
				if !ok {
					return true
				}
				l4, off = e[off], off+(int(e[off+1])+1)*8
				continue
			case header.IPv6FragmentExtHdrIdentifier:
				e, ok := s.pull(off + 8)
				if !ok {
					return true
				}
				fo := binary.BigEndian.Uint16(e[off+2:])
				if fo>>3 != 0 {
					return true
				}
				l4, off, frag = e[off], off+8, fo&1 != 0
				continue
			}
			break
		}
	default:
		return true
	}
	switch l4 {
	case policy.ProtoTCP:
		if frag {
			t, ok := s.pull(off + 4)
			if !ok {
				// A first fragment too short for the ports (RFC 1858's
				// tiny fragment): what it opens cannot be judged.
				m.Deny(policy.Flow{Dir: policy.Ingress, Proto: l4, Peer: src, Local: dst}, policy.TinyFragment)
				return false
			}
			return m.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: l4, Peer: src, Port: binary.BigEndian.Uint16(t[off+2:]), Local: dst})
		}
		t, ok := s.pull(off + header.TCPMinimumSize)
		if !ok {
			return true
		}
		if header.TCPFlags(t[off+13])&(header.TCPFlagSyn|header.TCPFlagAck) != header.TCPFlagSyn {
			return true
		}
		return m.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: l4, Peer: src, Port: binary.BigEndian.Uint16(t[off+2:]), Local: dst})
	case policy.ProtoICMP, policy.ProtoICMPv6:
		icmp, echo := policy.ProtoICMP, byte(header.ICMPv4Echo)
		if proto == header.IPv6ProtocolNumber {
			icmp, echo = policy.ProtoICMPv6, byte(header.ICMPv6EchoRequest)
		}
		if l4 != icmp {
			return true // the other family's ICMP: netstack ignores it
		}
		t, ok := s.pull(off + 1)
		if !ok || t[off] != echo {
			return true
		}
		return m.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: l4, Peer: src, Local: dst})
	}
	return true
}

// fromOwnAddr reports whether a packet of network protocol proto carries
// one of g's pod's own addresses as its source, counting it: nothing the
// network sends does (the stack's own frames never come back through the
// link's sockets, which ignore outgoing frames), so it is a forgery, which
// a kernel drops as a martian. Netstack would take it: a SYN from the
// pod's address to one of its ports would reach the application as a
// connection from the pod itself, past any policy that trusts the pod's
// own address.
func fromOwnAddr[S headerSource](g *gate, proto tcpip.NetworkProtocolNumber, s S) bool {
	if len(g.own) == 0 {
		return false
	}
	var src netip.Addr
	switch proto {
	case header.IPv4ProtocolNumber:
		h, ok := s.pull(header.IPv4MinimumSize)
		if !ok {
			return false
		}
		src = netip.AddrFrom4([4]byte(h[12:16]))
	case header.IPv6ProtocolNumber:
		h, ok := s.pull(header.IPv6MinimumSize)
		if !ok {
			return false
		}
		src = netip.AddrFrom16([16]byte(h[8:24]))
	default:
		return false
	}
	if slices.Contains(g.own, src) {
		g.stats.RxOwnSource.Add(1)
		return true
	}
	return false
}
