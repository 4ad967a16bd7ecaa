package relay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
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
// Only packets from the pod's own addresses go further (see spoof.go).
func (r *Relay) readTUN() {
	defer r.wg.Done()
	buf := make([]byte, tunReadSize)
	for {
		n, err := r.pod.TUN.Read(buf)
		if err != nil {
			if r.closing.Load() {
				return
			}
			if errors.Is(err, unix.EBADFD) {
				// The poller reports a detached TUN readable for ever:
				// reading on would spin.
				r.lostTUN(fmt.Errorf("reading the pod's TUN: %w", err))
				return
			}
			r.opts.Logger.Debug("reading the TUN", "err", err)
			continue
		}
		p := buf[:n]
		src, dst, ok := ipAddrs(p)
		if !ok || kernelLinkTraffic(src, dst) {
			r.stats.PodDropped.Add(1)
			continue
		}
		if !r.fromPod(src) {
			continue
		}
		if k, ok := parseSYN(p); ok {
			r.tcp.outboundSYN(k, append([]byte(nil), p...))
			continue
		}
		if r.icmp.handle(p) {
			continue
		}
		r.stats.PodDropped.Add(1)
	}
}

// writeTUN hands a packet to the pod's kernel.
func (e *env) writeTUN(p []byte) {
	if len(p) == 0 {
		return
	}
	if _, err := e.pod.TUN.Write(p); err != nil && !e.closing.Load() {
		if errors.Is(err, unix.EBADFD) {
			e.lostTUN(fmt.Errorf("writing to the pod's TUN: %w", err))
			return
		}
		e.opts.Logger.Debug("writing to the TUN", "err", err)
	}
}

// lostTUN reports, once, that the TUN's device is gone (EBADFD: the
// descriptor is attached to nothing any more, which a TUN only is once
// its device was deleted) to Options.TUNGone.
func (e *env) lostTUN(err error) {
	e.tunGone.Do(func() {
		err = fmt.Errorf("the pod's TUN %s is gone (deleted in the pod's namespace): %w", e.pod.TUN.Name(), err)
		if e.opts.TUNGone == nil {
			e.opts.Logger.Error("the relay stopped reading the pod's TUN", "err", err)
			return
		}
		e.opts.TUNGone(err)
	})
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
	ipLen, src, dst, ok := tcpHeaderAt(syn)
	if !ok || len(syn) < ipLen+20 {
		return nil
	}
	in := syn[ipLen:]
	p, t := newIPPacket(dst, src, protoTCP, 20)
	copy(t[0:2], in[2:4])
	copy(t[2:4], in[0:2])
	binary.BigEndian.PutUint32(t[8:12], binary.BigEndian.Uint32(in[4:8])+1)
	t[12] = 5 << 4
	t[13] = tcpFlagRST | tcpFlagACK
	binary.BigEndian.PutUint16(t[16:18], transportChecksum(dst, src, protoTCP, t))
	return p
}

const protoUDP = 17

// buildUDP makes an IPv4 or IPv6 UDP packet from src to dst, for a flow
// whose datagrams reach the application through the TUN (see udpFlow).
// It returns nil when the payload does not fit.
func buildUDP(src, dst netip.AddrPort, payload []byte) []byte {
	p, u := newIPPacket(src.Addr(), dst.Addr(), protoUDP, 8+len(payload))
	if p == nil {
		return nil
	}
	binary.BigEndian.PutUint16(u[0:2], src.Port())
	binary.BigEndian.PutUint16(u[2:4], dst.Port())
	binary.BigEndian.PutUint16(u[4:6], uint16(len(u)))
	copy(u[8:], payload)
	c := transportChecksum(src.Addr(), dst.Addr(), protoUDP, u)
	if c == 0 {
		c = 0xffff // zero means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(u[6:8], c)
	return p
}

// newIPPacket makes an IPv4 (header checksum filled in) or IPv6 packet
// from src to dst carrying proto, with l4Len zero bytes after the header,
// and returns it and those bytes; nil when l4Len does not fit.
func newIPPacket(src, dst netip.Addr, proto byte, l4Len int) (p, l4 []byte) {
	return putIPPacket(nil, src, dst, proto, l4Len)
}

// putIPPacket is newIPPacket in buf when it is large enough (a caller
// that answers a flood reuses its buffers), in a new slice otherwise.
func putIPPacket(buf []byte, src, dst netip.Addr, proto byte, l4Len int) (p, l4 []byte) {
	if src.Is4() {
		if 20+l4Len > 65535 {
			return nil, nil
		}
		p = sized(buf, 20+l4Len)
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
		p[8] = 64
		p[9] = proto
		copy(p[12:16], src.AsSlice())
		copy(p[16:20], dst.AsSlice())
		binary.BigEndian.PutUint16(p[10:12], ^checksum.Checksum(p[:20], 0))
		return p, p[20:]
	}
	if l4Len > 65535 {
		return nil, nil
	}
	p = sized(buf, 40+l4Len)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(l4Len))
	p[6] = proto
	p[7] = 64
	copy(p[8:24], src.AsSlice())
	copy(p[24:40], dst.AsSlice())
	return p, p[40:]
}

// sized is buf[:n] zeroed, or a new slice when buf is too small.
func sized(buf []byte, n int) []byte {
	if cap(buf) < n {
		return make([]byte, n)
	}
	buf = buf[:n]
	clear(buf)
	return buf
}

// transportChecksum is the TCP or UDP checksum of l4 (its checksum field
// zero) under the pseudo-header of src, dst and proto.
func transportChecksum(src, dst netip.Addr, proto byte, l4 []byte) uint16 {
	s, d := addrBytes(src), addrBytes(dst)
	n := src.BitLen() / 8
	sum := checksum.Checksum(s[:n], 0)
	sum = checksum.Checksum(d[:n], sum)
	sum = checksum.Combine(sum, uint16(proto))
	sum = checksum.Combine(sum, uint16(len(l4)))
	return ^checksum.Checksum(l4, sum)
}
