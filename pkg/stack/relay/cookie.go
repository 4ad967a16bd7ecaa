package relay

import (
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// A SYN flood reaches a mirrored listener faster than netstack's listener
// path can answer it (each SYN pays for the link's dispatch, IP, the TCP
// demultiplexer, a hand-off to a TCP processor goroutine and the SYN
// cookie; docs/reliability/hostile.md, "A SYN flood at full speed",
// holds the profile), and the link caps what it hands netstack (podstack's
// SYN admission). The SYNs beyond that cap to a mirrored port are answered
// here instead, in the link's receiving goroutine: a SYN-ACK carrying the
// very cookie netstack's listener would have sent, built from the SYN's
// bytes and handed to the NIC's queue, without netstack's path. A real
// client's ACK then reaches the listener like any answer to a cookie:
// netstack validates it and completes the connection, which the relay
// accepts as usual. Spoofed sources never answer and cost nothing more.
//
// The cookie's key (two random nonces per listener) is read once per
// mirrored listener with tcp.Endpoint.SYNCookieNonces, which the gVisor
// patch 0003 (docs/gvisor-patches.md) exports; the cookie is computed here
// as netstack computes it, so that a flood's SYNs cost no lock.
// TestSYNCookieFastPath fails if netstack's cookie changes.

// The cookie's layout, as in gVisor's tcp/accept.go.
const (
	cookieTSLen     = 8
	cookieTSMask    = 1<<cookieTSLen - 1
	cookieTSOffset  = 24
	cookieHashMask  = 1<<cookieTSOffset - 1
	cookieWindow    = 65535
	tcpOptionMSS    = 2
	synAckHeaderLen = header.TCPMinimumSize + 4 // with the MSS option
)

// cookieMSS are the MSS values a cookie can encode (tcp/accept.go's
// mssTable).
var cookieMSS = []uint16{536, 1300, 1440, 1460}

func encodeCookieMSS(mss uint16) uint32 {
	for i := len(cookieMSS) - 1; i > 0; i-- {
		if mss >= cookieMSS[i] {
			return uint32(i)
		}
	}
	return 0
}

// cookieKey is one listener's SYN cookie key. Read-only once made.
type cookieKey struct {
	nonce [2][sha1.BlockSize]byte
}

var errNotListening = errors.New("not a listening netstack TCP endpoint")

// listenerCookieKey reads the SYN cookie key of ep, a listening netstack
// TCP endpoint.
func listenerCookieKey(ep tcpip.Endpoint) (*cookieKey, error) {
	tep, ok := ep.(*tcp.Endpoint)
	if !ok {
		return nil, errNotListening
	}
	nonces, ok := tep.SYNCookieNonces()
	if !ok {
		return nil, errNotListening
	}
	return &cookieKey{nonce: nonces}, nil
}

// hash is tcp/accept.go's cookieHash: SHA-1 over the ports, the time, one
// nonce and the addresses, in that order. One sha1.Sum over a buffer on the
// stack: no allocation and no lock, as it runs twice per flooding SYN.
func (k *cookieKey) hash(local, remote []byte, localPort, remotePort uint16, ts uint32, nonce int) uint32 {
	var in [8 + sha1.BlockSize + 2*16]byte
	binary.BigEndian.PutUint16(in[0:], localPort)
	binary.BigEndian.PutUint16(in[2:], remotePort)
	binary.BigEndian.PutUint32(in[4:], ts)
	n := 8 + copy(in[8:], k.nonce[nonce][:])
	n += copy(in[n:], local)
	n += copy(in[n:], remote)
	sum := sha1.Sum(in[:n])
	return binary.BigEndian.Uint32(sum[:])
}

// cookie is tcp/accept.go's createCookie at netstack time ts.
func (k *cookieKey) cookie(local, remote []byte, localPort, remotePort uint16, seq uint32, data uint32, ts uint32) uint32 {
	v := k.hash(local, remote, localPort, remotePort, 0, 0) + seq + ts<<cookieTSOffset
	v += (k.hash(local, remote, localPort, remotePort, ts, 1) + data) & cookieHashMask
	return v
}

// cookieTime is the cookie's timestamp (tcp/accept.go's timeStamp): 64 s
// ticks of the stack's monotonic clock.
func (t *tcpRelay) cookieTime() uint32 {
	return uint32(t.wire.Stack.Clock().NowMonotonic().Sub(tcpip.MonotonicTime{}).Seconds()) >> 6 & cookieTSMask
}

// cookieKeyFor finds the key of the mirrored listener netstack would hand
// a SYN to dst:port: one bound to dst, else one on any address of the
// family.
func (m *mirror) cookieKeyFor(dst netip.Addr, port uint16) *cookieKey {
	keys := m.cookieKeys.Load()
	if keys == nil {
		return nil
	}
	v6 := dst.Is6()
	if k := (*keys)[mirrorKey{addr: tcpipAddr(dst), port: port, v6: v6}]; k != nil {
		return k
	}
	return (*keys)[mirrorKey{port: port, v6: v6}]
}

// AnswerSYN answers a SYN from the wire (pkt: the IP packet, from the
// link whose address is linkAddr, sent by the link address from) with a
// SYN cookie, as the mirrored listener for its destination would, and
// reports whether it did. It sends nothing for a SYN to a port without a
// mirrored listener. Safe for concurrent use.
func (r *Relay) AnswerSYN(pkt []byte, from tcpip.LinkAddress) bool { return r.tcp.answerSYN(pkt, from) }

func (t *tcpRelay) answerSYN(pkt []byte, from tcpip.LinkAddress) bool {
	p, proto, ok := t.synCookieAnswer(nil, pkt)
	if !ok {
		return false
	}
	if err := t.wire.Stack.WritePacketToRemote(t.wire.NIC, from, proto, buffer.MakeWithData(p)); err != nil {
		if _, full := err.(*tcpip.ErrNoBufferSpace); !full || t.wire.WriteDirect == nil {
			t.stats.TCPCookieFastErrors.Add(1)
			return false
		}
		if err := t.wire.WriteDirect(from, proto, p); err != nil {
			t.stats.TCPCookieFastErrors.Add(1)
			return false
		}
		t.stats.TCPCookieFastDirect.Add(1)
	}
	t.stats.TCPCookieFast.Add(1)
	return true
}

// SYNCookieAnswer builds, in buf when it is large enough (the IP packet
// of a SYN-ACK takes at most 64 bytes), the answer AnswerSYN would send to
// pkt, a SYN's IP packet, and returns it with its network protocol; ok is
// false for a SYN to a port without a mirrored listener. For a caller
// that sends the answers itself and reports the outcome with
// CountFastCookies. Safe for concurrent use; allocation-free with a buf,
// as it runs once per flooding SYN.
func (r *Relay) SYNCookieAnswer(buf, pkt []byte) (answer []byte, proto tcpip.NetworkProtocolNumber, ok bool) {
	return r.tcp.synCookieAnswer(buf, pkt)
}

func (t *tcpRelay) synCookieAnswer(buf, pkt []byte) (answer []byte, proto tcpip.NetworkProtocolNumber, ok bool) {
	ipLen, src, dst, ok := tcpHeaderAt(pkt)
	if !ok || len(pkt) < ipLen+header.TCPMinimumSize {
		return nil, 0, false
	}
	syn := header.TCP(pkt[ipLen:])
	off := int(syn.DataOffset())
	if syn.Flags() != tcpFlagSYN || off < header.TCPMinimumSize || len(syn) < off {
		return nil, 0, false
	}
	k := t.mirror.cookieKeyFor(dst, syn.DestinationPort())
	if k == nil {
		return nil, 0, false
	}
	opts := header.ParseSynOptions(syn[header.TCPMinimumSize:off], false)
	// What netstack's listener advertises: the route's MTU less the TCP
	// header (tcp.calculateAdvertisedMSS).
	mss := t.wireMTU - header.IPv4MinimumSize - header.TCPMinimumSize
	proto = ipv4.ProtocolNumber
	if dst.Is6() {
		mss = t.wireMTU - header.IPv6MinimumSize - header.TCPMinimumSize
		proto = ipv6.ProtocolNumber
	}
	dstB, srcB := addrBytes(dst), addrBytes(src)
	n := dst.BitLen() / 8
	cookie := k.cookie(dstB[:n], srcB[:n], syn.DestinationPort(), syn.SourcePort(), syn.SequenceNumber(), encodeCookieMSS(opts.MSS), t.cookieTime())

	p, seg := putIPPacket(buf, dst, src, protoTCP, synAckHeaderLen)
	if p == nil {
		return nil, 0, false
	}
	// Like netstack's cookie SYN-ACK: no window scaling (a cookie does
	// not encode it), no SACK, no timestamps; the MSS option only.
	header.TCP(seg).Encode(&header.TCPFields{
		SrcPort:    syn.DestinationPort(),
		DstPort:    syn.SourcePort(),
		SeqNum:     cookie,
		AckNum:     syn.SequenceNumber() + 1,
		DataOffset: synAckHeaderLen,
		Flags:      header.TCPFlagSyn | header.TCPFlagAck,
		WindowSize: cookieWindow,
	})
	seg[20], seg[21] = tcpOptionMSS, 4
	binary.BigEndian.PutUint16(seg[22:24], uint16(mss))
	binary.BigEndian.PutUint16(seg[16:18], transportChecksum(dst, src, protoTCP, seg))
	return p, proto, true
}

// addrBytes is a's bytes in the first 4 or 16 of an array: AsSlice
// allocates.
func addrBytes(a netip.Addr) (b [16]byte) {
	if a.Is4() {
		v4 := a.As4()
		copy(b[:], v4[:])
		return b
	}
	return a.As16()
}

// CountFastCookies counts answers from SYNCookieAnswer that their caller
// sent, and those it failed to send.
func (r *Relay) CountFastCookies(sent, failed int) {
	if sent > 0 {
		r.stats.TCPCookieFast.Add(int64(sent))
	}
	if failed > 0 {
		r.stats.TCPCookieFastErrors.Add(int64(failed))
	}
}

// publishCookieKeys makes the fast path use the mirrored listeners in eps.
// Called with the mirror's mu held.
func (m *mirror) publishCookieKeys(eps map[mirrorKey]*mirrored) {
	keys := make(map[mirrorKey]*cookieKey, len(eps))
	for k, e := range eps {
		if e.cookies != nil {
			keys[k] = e.cookies
		}
	}
	m.cookieKeys.Store(&keys)
}

// keyOf reads a new mirrored listener's cookie key; a failure leaves that
// listener to netstack's own path, logged once per relay.
func (m *mirror) keyOf(ep tcpip.Endpoint) *cookieKey {
	k, err := listenerCookieKey(ep)
	if err != nil && m.cookieKeyLogged.CompareAndSwap(false, true) {
		m.opts.Logger.Warn("SYN cookie fast path off: a flood's SYNs beyond the admission cap are dropped instead of answered", "err", fmt.Errorf("reading a listener's SYN cookie key: %w", err))
	}
	return k
}
