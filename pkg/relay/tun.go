package relay

import (
	"encoding/binary"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

const (
	protoTCP    = 6
	tcpFlagSYN  = 0x02
	tcpFlagRST  = 0x04
	tcpFlagACK  = 0x10
	tunReadSize = 65536
)

// readTUN takes what the divert rules leave in the TUN: the applications'
// first SYNs, their echo requests, and protocols the relay does not carry.
func (r *Relay) readTUN() {
	defer r.wg.Done()
	buf := make([]byte, tunReadSize)
	for {
		n, err := r.pod.TUN.Read(buf)
		if err != nil {
			if r.closing.Load() {
				return
			}
			r.opts.Logger.Debug("reading the TUN", "err", err)
			continue
		}
		p := buf[:n]
		if k, ok := parseSYN(p); ok {
			r.outboundSYN(k, append([]byte(nil), p...))
			continue
		}
		if r.pinger.handle(p) {
			continue
		}
		r.stats.PodDropped.Add(1)
	}
}

// writeTUN hands a packet to the pod's kernel.
func (r *Relay) writeTUN(p []byte) {
	if len(p) == 0 {
		return
	}
	if _, err := r.pod.TUN.Write(p); err != nil && !r.closing.Load() {
		r.opts.Logger.Debug("writing to the TUN", "err", err)
	}
}

// parseSYN recognises a TCP SYN (without ACK) and returns its addresses.
// The bytes come from the applications: every length is checked. IPv6
// extension headers are not followed (a SYN carries none).
func parseSYN(p []byte) (flowKey, bool) {
	ipLen, src, dst, ok := tcpHeaderAt(p)
	if !ok || len(p) < ipLen+20 {
		return flowKey{}, false
	}
	t := p[ipLen:]
	if t[13]&(tcpFlagSYN|tcpFlagACK|tcpFlagRST) != tcpFlagSYN {
		return flowKey{}, false
	}
	return flowKey{
		app:    netip.AddrPortFrom(src, binary.BigEndian.Uint16(t[0:2])),
		remote: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(t[2:4])),
	}, true
}

// tcpHeaderAt returns where the TCP header of an IPv4 or IPv6 packet
// starts, and the packet's addresses.
func tcpHeaderAt(p []byte) (int, netip.Addr, netip.Addr, bool) {
	if len(p) < 1 {
		return 0, netip.Addr{}, netip.Addr{}, false
	}
	switch p[0] >> 4 {
	case 4:
		if len(p) < 20 {
			break
		}
		ihl := int(p[0]&0x0f) * 4
		// A fragment is not a whole SYN.
		if ihl < 20 || p[9] != protoTCP || binary.BigEndian.Uint16(p[6:8])&0x3fff != 0 {
			break
		}
		return ihl, netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20])), true
	case 6:
		if len(p) < 40 || p[6] != protoTCP {
			break
		}
		return 40, netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40])), true
	}
	return 0, netip.Addr{}, netip.Addr{}, false
}

// buildRST answers a SYN the way a refusing peer would: RST+ACK from the
// SYN's destination, acknowledging the SYN.
func buildRST(syn []byte) []byte {
	ipLen, src, _, ok := tcpHeaderAt(syn)
	if !ok || len(syn) < ipLen+20 {
		return nil
	}
	in := syn[ipLen:]
	var out []byte
	if src.Is4() {
		out = make([]byte, 40)
		out[0] = 0x45
		binary.BigEndian.PutUint16(out[2:4], 40)
		out[8] = 64
		out[9] = protoTCP
		copy(out[12:16], syn[16:20])
		copy(out[16:20], syn[12:16])
		binary.BigEndian.PutUint16(out[10:12], ^checksum.Checksum(out[:20], 0))
	} else {
		out = make([]byte, 60)
		out[0] = 0x60
		binary.BigEndian.PutUint16(out[4:6], 20)
		out[6] = protoTCP
		out[7] = 64
		copy(out[8:24], syn[24:40])
		copy(out[24:40], syn[8:24])
	}
	t := out[len(out)-20:]
	copy(t[0:2], in[2:4])
	copy(t[2:4], in[0:2])
	binary.BigEndian.PutUint32(t[8:12], binary.BigEndian.Uint32(in[4:8])+1)
	t[12] = 5 << 4
	t[13] = tcpFlagRST | tcpFlagACK
	// Pseudo-header: addresses (swapped, but the sum is the same), protocol,
	// length.
	sum := checksum.Checksum(out[len(out)-20-2*src.BitLen()/8:len(out)-20], 0)
	sum = checksum.Combine(sum, protoTCP)
	sum = checksum.Combine(sum, 20)
	binary.BigEndian.PutUint16(t[16:18], ^checksum.Checksum(t, sum))
	return out
}

const protoUDP = 17

// buildUDP makes an IPv4 or IPv6 UDP packet from src to dst, for a flow
// whose datagrams reach the application through the TUN (see udpFlow).
// It returns nil when the payload does not fit.
func buildUDP(src, dst netip.AddrPort, payload []byte) []byte {
	udpLen := 8 + len(payload)
	var p []byte
	var ipLen int
	if src.Addr().Is4() {
		ipLen = 20
		if ipLen+udpLen > 65535 {
			return nil
		}
		p = make([]byte, ipLen+udpLen)
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:4], uint16(ipLen+udpLen))
		p[8] = 64
		p[9] = protoUDP
		copy(p[12:16], src.Addr().AsSlice())
		copy(p[16:20], dst.Addr().AsSlice())
		binary.BigEndian.PutUint16(p[10:12], ^checksum.Checksum(p[:20], 0))
	} else {
		ipLen = 40
		if udpLen > 65535 {
			return nil
		}
		p = make([]byte, ipLen+udpLen)
		p[0] = 0x60
		binary.BigEndian.PutUint16(p[4:6], uint16(udpLen))
		p[6] = protoUDP
		p[7] = 64
		copy(p[8:24], src.Addr().AsSlice())
		copy(p[24:40], dst.Addr().AsSlice())
	}
	u := p[ipLen:]
	binary.BigEndian.PutUint16(u[0:2], src.Port())
	binary.BigEndian.PutUint16(u[2:4], dst.Port())
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen))
	copy(u[8:], payload)
	n := 4
	if src.Addr().Is6() {
		n = 16
	}
	sum := checksum.Checksum(p[ipLen-2*n:ipLen], 0)
	sum = checksum.Combine(sum, protoUDP)
	sum = checksum.Combine(sum, uint16(udpLen))
	c := ^checksum.Checksum(u, sum)
	if c == 0 {
		c = 0xffff // zero means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(u[6:8], c)
	return p
}
