package relay

import (
	"encoding/binary"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// echo is an ICMP or ICMPv6 echo request an application sent.
type echo struct {
	src, dst netip.Addr
	id, seq  uint16
	data     []byte // after the 8-byte echo header
}

const (
	icmpv4EchoRequest = 8
	icmpv4EchoReply   = 0
	icmpv6EchoRequest = 128
	icmpv6EchoReply   = 129
	protoICMPv4       = 1
	protoICMPv6       = 58
)

// parseEchoRequest recognises an IPv4 or IPv6 packet carrying an echo
// request. It is given bytes from the applications, so it checks every
// length before reading. IPv6 extension headers are not followed: a ping
// carries none.
func parseEchoRequest(p []byte) (echo, bool) {
	if len(p) < 1 {
		return echo{}, false
	}
	switch p[0] >> 4 {
	case 4:
		if len(p) < 20 {
			return echo{}, false
		}
		ihl := int(p[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(p[2:4]))
		if ihl < 20 || total < ihl+8 || total > len(p) || p[9] != protoICMPv4 {
			return echo{}, false
		}
		// A fragment is not a whole echo request.
		if binary.BigEndian.Uint16(p[6:8])&0x3fff != 0 {
			return echo{}, false
		}
		icmp := p[ihl:total]
		if icmp[0] != icmpv4EchoRequest || icmp[1] != 0 {
			return echo{}, false
		}
		return echo{
			src:  netip.AddrFrom4([4]byte(p[12:16])),
			dst:  netip.AddrFrom4([4]byte(p[16:20])),
			id:   binary.BigEndian.Uint16(icmp[4:6]),
			seq:  binary.BigEndian.Uint16(icmp[6:8]),
			data: icmp[8:],
		}, true
	case 6:
		if len(p) < 48 {
			return echo{}, false
		}
		plen := int(binary.BigEndian.Uint16(p[4:6]))
		if p[6] != protoICMPv6 || plen < 8 || 40+plen > len(p) {
			return echo{}, false
		}
		icmp := p[40 : 40+plen]
		if icmp[0] != icmpv6EchoRequest || icmp[1] != 0 {
			return echo{}, false
		}
		return echo{
			src:  netip.AddrFrom16([16]byte(p[8:24])),
			dst:  netip.AddrFrom16([16]byte(p[24:40])),
			id:   binary.BigEndian.Uint16(icmp[4:6]),
			seq:  binary.BigEndian.Uint16(icmp[6:8]),
			data: icmp[8:],
		}, true
	}
	return echo{}, false
}

// buildEchoReply makes the packet the application expects back: an echo
// reply from the pinged address to the application, with its own id.
func buildEchoReply(e echo, data []byte) []byte {
	if e.src.Is4() {
		p := make([]byte, 20+8+len(data))
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
		p[8] = 64
		p[9] = protoICMPv4
		copy(p[12:16], e.dst.AsSlice())
		copy(p[16:20], e.src.AsSlice())
		binary.BigEndian.PutUint16(p[10:12], ^checksum.Checksum(p[:20], 0))
		icmp := p[20:]
		icmp[0] = icmpv4EchoReply
		binary.BigEndian.PutUint16(icmp[4:6], e.id)
		binary.BigEndian.PutUint16(icmp[6:8], e.seq)
		copy(icmp[8:], data)
		binary.BigEndian.PutUint16(icmp[2:4], ^checksum.Checksum(icmp, 0))
		return p
	}
	p := make([]byte, 40+8+len(data))
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(8+len(data)))
	p[6] = protoICMPv6
	p[7] = 64
	copy(p[8:24], e.dst.AsSlice())
	copy(p[24:40], e.src.AsSlice())
	icmp := p[40:]
	icmp[0] = icmpv6EchoReply
	binary.BigEndian.PutUint16(icmp[4:6], e.id)
	binary.BigEndian.PutUint16(icmp[6:8], e.seq)
	copy(icmp[8:], data)
	// The ICMPv6 checksum covers a pseudo-header of addresses, length and
	// next header (RFC 8200 section 8.1).
	var pseudo [40]byte
	copy(pseudo[0:32], p[8:40])
	binary.BigEndian.PutUint32(pseudo[32:36], uint32(len(icmp)))
	pseudo[39] = protoICMPv6
	binary.BigEndian.PutUint16(icmp[2:4], ^checksum.Checksum(icmp, checksum.Checksum(pseudo[:], 0)))
	return p
}
