// Package gso segments TCP GSO packets in software: one large packet from
// netstack becomes MSS-sized segments with their own headers and
// checksums, ready to be sent together with one sendmmsg. It is the
// splitter of the "software" GSO mode; which mode a link gets is decided
// in pkg/offload.
package gso

import (
	"encoding/binary"
	"errors"
	"fmt"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

const (
	protoTCP      = 6
	tcpFlagFIN    = 0x01
	tcpFlagPSH    = 0x08
	tcpFlagCWR    = 0x80
	ipv4MinHdrLen = 20
	ipv6HdrLen    = 40
	tcpMinHdrLen  = 20
)

// ErrNotTCP is returned for packets Split cannot segment.
var ErrNotTCP = errors.New("not a TCP packet over IPv4 or IPv6 without extension headers")

// Segments is the result of Split: headers[i] followed by payloads[i] is
// segment i. Headers are written into the caller's buffer; payloads alias
// the input frame, so the frame must outlive the send.
type Segments struct {
	Headers  [][]byte
	Payloads [][]byte
}

// Reset empties s, keeping its storage.
func (s *Segments) Reset() {
	s.Headers = s.Headers[:0]
	s.Payloads = s.Payloads[:0]
}

// Split cuts frame into TCP segments of at most mss payload bytes and
// appends them to segs. frame is linkLen bytes of link header (copied into
// every segment), then an IPv4 or IPv6 header, a TCP header and the
// payload. hdrBuf provides the headers' storage and must hold
// segments*(linkLen+IP+TCP header) bytes; it returns what is left of it.
//
// Every segment gets what a kernel's TSO gives it: IPv4 total length,
// identification (incremented per segment) and header checksum; IPv6
// payload length; TCP sequence number advanced by the payload before it;
// FIN and PSH kept only on the last segment, CWR only on the first; a full
// TCP checksum (the input's, a partial pseudo-header sum, is ignored).
// A packet whose payload fits in one segment comes out as one segment with
// its checksum completed, so Split also serves packets that merely carry
// a partial checksum.
func Split(frame []byte, linkLen, mss int, hdrBuf []byte, segs *Segments) ([]byte, error) {
	if mss <= 0 {
		return hdrBuf, fmt.Errorf("mss %d", mss)
	}
	if len(frame) < linkLen+ipv4MinHdrLen {
		return hdrBuf, fmt.Errorf("frame of %d bytes is too short", len(frame))
	}
	ip := frame[linkLen:]
	var ipLen int
	v6 := false
	switch ip[0] >> 4 {
	case 4:
		ipLen = int(ip[0]&0x0f) * 4
		if ipLen < ipv4MinHdrLen || ip[9] != protoTCP {
			return hdrBuf, ErrNotTCP
		}
		total := int(binary.BigEndian.Uint16(ip[2:4]))
		if total < ipLen || total > len(ip) {
			return hdrBuf, fmt.Errorf("IPv4 total length %d, have %d bytes", total, len(ip))
		}
		ip = ip[:total]
	case 6:
		if len(ip) < ipv6HdrLen || ip[6] != protoTCP {
			return hdrBuf, ErrNotTCP
		}
		ipLen = ipv6HdrLen
		plen := int(binary.BigEndian.Uint16(ip[4:6]))
		if ipLen+plen > len(ip) {
			return hdrBuf, fmt.Errorf("IPv6 payload length %d, have %d bytes", plen, len(ip)-ipLen)
		}
		ip = ip[:ipLen+plen]
		v6 = true
	default:
		return hdrBuf, ErrNotTCP
	}
	if len(ip) < ipLen+tcpMinHdrLen {
		return hdrBuf, fmt.Errorf("truncated TCP header")
	}
	tcp := ip[ipLen:]
	tcpLen := int(tcp[12]>>4) * 4
	if tcpLen < tcpMinHdrLen || tcpLen > len(tcp) {
		return hdrBuf, fmt.Errorf("TCP data offset %d, have %d bytes", tcpLen, len(tcp))
	}
	payload := tcp[tcpLen:]
	hdrLen := linkLen + ipLen + tcpLen
	n := max(1, (len(payload)+mss-1)/mss)
	if len(hdrBuf) < n*hdrLen {
		return hdrBuf, fmt.Errorf("header buffer of %d bytes, need %d", len(hdrBuf), n*hdrLen)
	}
	seq := binary.BigEndian.Uint32(tcp[4:8])
	flags := tcp[13]
	var id uint16
	if !v6 {
		id = binary.BigEndian.Uint16(ip[4:6])
	}
	// The pseudo-header's address part is the same for every segment.
	var addrSum uint16
	if v6 {
		addrSum = checksum.Checksum(ip[8:40], 0)
	} else {
		addrSum = checksum.Checksum(ip[12:20], 0)
	}
	for i := range n {
		p := payload[min(i*mss, len(payload)):min((i+1)*mss, len(payload))]
		h := hdrBuf[:hdrLen:hdrLen]
		hdrBuf = hdrBuf[hdrLen:]
		copy(h, frame[:hdrLen])
		hip := h[linkLen:]
		htcp := hip[ipLen:]
		segLen := tcpLen + len(p)
		if v6 {
			binary.BigEndian.PutUint16(hip[4:6], uint16(segLen))
		} else {
			binary.BigEndian.PutUint16(hip[2:4], uint16(ipLen+segLen))
			binary.BigEndian.PutUint16(hip[4:6], id+uint16(i))
			hip[10], hip[11] = 0, 0
			binary.BigEndian.PutUint16(hip[10:12], ^checksum.Checksum(hip[:ipLen], 0))
		}
		binary.BigEndian.PutUint32(htcp[4:8], seq+uint32(i*mss))
		f := flags
		if i != n-1 {
			f &^= tcpFlagFIN | tcpFlagPSH
		}
		if i != 0 {
			f &^= tcpFlagCWR
		}
		htcp[13] = f
		htcp[16], htcp[17] = 0, 0
		var pseudo [4]byte
		binary.BigEndian.PutUint16(pseudo[0:2], protoTCP)
		binary.BigEndian.PutUint16(pseudo[2:4], uint16(segLen))
		sum := checksum.Checksum(pseudo[:], addrSum)
		sum = checksum.Checksum(htcp, sum)
		sum = checksum.Checksum(p, sum)
		binary.BigEndian.PutUint16(htcp[16:18], ^sum)
		segs.Headers = append(segs.Headers, h)
		segs.Payloads = append(segs.Payloads, p)
	}
	return hdrBuf, nil
}
