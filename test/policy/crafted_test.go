package policy

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestCraftedSYNs: SYNs that netstack sees only once reassembled (two
// fragments) or behind IPv6 extension headers, sent from raw sockets in
// the peers' namespaces, get what the policy says: a SYN-ACK for the
// allowed peer (the packets are good), nothing for the other.
func TestCraftedSYNs(t *testing.T) {
	r := newRig(t)
	r.push(t, r.ingressOnly(policy.Rule{Policy: "test/in",
		Peers: []policy.Peer{{CIDR: hostCIDR(r.allowed.IP(4))}, {CIDR: hostCIDR(r.allowed.IP(6))}},
		Ports: []policy.PortRange{{Protocol: policy.TCP, First: tcpPort}}}))
	for _, c := range []struct {
		name  string
		fam   int
		build func(src, dst netip.Addr, sport uint16) [][]byte
	}{
		{"IPv4 SYN in two fragments", 4, fragmentedSYN4},
		{"IPv6 SYN behind hop-by-hop and destination options", 6, optionsSYN6},
		{"IPv6 SYN in two fragments", 6, fragmentedSYN6},
	} {
		for _, peer := range []struct {
			pod     *nettest.Pod
			allowed bool
		}{{r.allowed, true}, {r.other, false}} {
			got, err := synAcked(peer.pod, r.pod.IP(c.fam), c.build)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if got != peer.allowed {
				t.Errorf("%s from %s: SYN-ACK %v, want %v", c.name, peer.pod.IP(c.fam), got, peer.allowed)
			}
		}
	}
}

// synAcked sends build's packets from pod's namespace to dst:tcpPort and
// reports whether a SYN-ACK came back within blockWait.
func synAcked(pod *nettest.Pod, dst netip.Addr, build func(src, dst netip.Addr, sport uint16) [][]byte) (acked bool, err error) {
	err = nettest.In(pod.NS, func() error {
		fam, level, hdrincl, ipv := unix.AF_INET, unix.IPPROTO_IP, unix.IP_HDRINCL, 4
		if dst.Is6() {
			fam, level, hdrincl, ipv = unix.AF_INET6, unix.IPPROTO_IPV6, unix.IPV6_HDRINCL, 6
		}
		rx, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(rx)
		tx, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(tx)
		if err := unix.SetsockoptInt(tx, level, hdrincl, 1); err != nil {
			return err
		}
		sport := uint16(40000 + rand.IntN(20000))
		var to unix.Sockaddr
		if dst.Is6() {
			to = &unix.SockaddrInet6{Addr: dst.As16()}
		} else {
			to = &unix.SockaddrInet4{Addr: dst.As4()}
		}
		for _, p := range build(pod.IP(ipv), dst, sport) {
			if err := unix.Sendto(tx, p, 0, to); err != nil {
				return err
			}
		}
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		if err := unix.SetsockoptTimeval(rx, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		buf := make([]byte, 2048)
		for deadline := time.Now().Add(blockWait); time.Now().Before(deadline); {
			n, from, err := unix.Recvfrom(rx, buf, 0)
			if err != nil {
				continue // the timeout: look at the clock
			}
			seg := buf[:n]
			var src netip.Addr
			switch a := from.(type) {
			case *unix.SockaddrInet4:
				src = netip.AddrFrom4(a.Addr)
				if len(seg) < header.IPv4MinimumSize {
					continue
				}
				seg = seg[header.IPv4(seg).HeaderLength():] // IPv4 raw sockets get the IP header
			case *unix.SockaddrInet6:
				src = netip.AddrFrom16(a.Addr)
			}
			if src != dst || len(seg) < header.TCPMinimumSize {
				continue
			}
			h := header.TCP(seg)
			if h.SourcePort() == tcpPort && h.DestinationPort() == sport && h.Flags() == header.TCPFlagSyn|header.TCPFlagAck {
				acked = true
				return nil
			}
		}
		return nil
	})
	return acked, err
}

// syn is a TCP SYN from src:sport to dst:tcpPort, checksummed.
func syn(src, dst netip.Addr, sport uint16) []byte {
	b := make([]byte, header.TCPMinimumSize)
	h := header.TCP(b)
	h.Encode(&header.TCPFields{SrcPort: sport, DstPort: tcpPort, SeqNum: rand.Uint32(), DataOffset: header.TCPMinimumSize,
		Flags: header.TCPFlagSyn, WindowSize: 64240})
	sum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, tcpip.AddrFromSlice(src.AsSlice()), tcpip.AddrFromSlice(dst.AsSlice()), uint16(len(b)))
	h.SetChecksum(^h.CalculateChecksum(sum))
	return b
}

// fragmentedSYN4 is a SYN in two IPv4 fragments: the first with 16 bytes
// of the TCP header (ports, flags), the second with the rest.
func fragmentedSYN4(src, dst netip.Addr, sport uint16) [][]byte {
	seg := syn(src, dst, sport)
	id := uint16(rand.IntN(65536))
	frag := func(off uint16, more bool, payload []byte) []byte {
		b := make([]byte, header.IPv4MinimumSize+len(payload))
		var flags uint8
		if more {
			flags = header.IPv4FlagMoreFragments
		}
		header.IPv4(b).Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), ID: id, Flags: flags, FragmentOffset: off, TTL: 64,
			Protocol: uint8(header.TCPProtocolNumber), SrcAddr: tcpip.AddrFrom4(src.As4()), DstAddr: tcpip.AddrFrom4(dst.As4())})
		header.IPv4(b).SetChecksum(^header.IPv4(b).CalculateChecksum())
		copy(b[header.IPv4MinimumSize:], payload)
		return b
	}
	return [][]byte{frag(0, true, seg[:16]), frag(16, false, seg[16:])}
}

// ipv6 is an IPv6 packet from src to dst whose first header is next.
func ipv6(src, dst netip.Addr, next uint8, payload []byte) []byte {
	b := make([]byte, header.IPv6MinimumSize+len(payload))
	header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: uint16(len(payload)), TransportProtocol: tcpip.TransportProtocolNumber(next),
		HopLimit: 64, SrcAddr: tcpip.AddrFrom16(src.As16()), DstAddr: tcpip.AddrFrom16(dst.As16())})
	copy(b[header.IPv6MinimumSize:], payload)
	return b
}

// optionsSYN6 is a SYN behind a hop-by-hop and a destination options
// header, each 8 bytes of padding.
func optionsSYN6(src, dst netip.Addr, sport uint16) [][]byte {
	payload := []byte{
		uint8(header.IPv6DestinationOptionsExtHdrIdentifier), 0, 1, 4, 0, 0, 0, 0, // hop-by-hop: PadN
		uint8(header.TCPProtocolNumber), 0, 1, 4, 0, 0, 0, 0, // destination options: PadN
	}
	payload = append(payload, syn(src, dst, sport)...)
	return [][]byte{ipv6(src, dst, uint8(header.IPv6HopByHopOptionsExtHdrIdentifier), payload)}
}

// fragmentedSYN6 is a SYN in two IPv6 fragments, split as fragmentedSYN4.
func fragmentedSYN6(src, dst netip.Addr, sport uint16) [][]byte {
	seg := syn(src, dst, sport)
	id := rand.Uint32()
	frag := func(off uint16, more bool, payload []byte) []byte {
		fh := make([]byte, 8)
		fh[0] = uint8(header.TCPProtocolNumber)
		fo := off
		if more {
			fo |= 1
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], id)
		return ipv6(src, dst, uint8(header.IPv6FragmentExtHdrIdentifier), append(fh, payload...))
	}
	return [][]byte{frag(0, true, seg[:16]), frag(16, false, seg[16:])}
}
