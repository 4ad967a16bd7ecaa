package relay

import (
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/netip"
	"reflect"
	"sync"
	"unsafe"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
)

// A SYN flood reaches a mirrored listener faster than netstack's listener
// path can answer it (about 10 µs of CPU per SYN: the link's dispatch,
// IP, the TCP demultiplexer, a hand-off to a TCP processor goroutine and
// the SYN cookie), and the link caps what it hands netstack (podstack's
// SYN admission). The SYNs beyond that cap to a mirrored port are answered
// here instead, in the link's receiving goroutine: a SYN-ACK carrying the
// very cookie netstack's listener would have sent, built from the SYN's
// bytes and handed to the NIC's queue, without netstack's path. A real
// client's ACK then reaches the listener like any answer to a cookie:
// netstack validates it and completes the connection, which the relay
// accepts as usual. Spoofed sources never answer and cost nothing more.
//
// The cookie's key (two random nonces per listener) is private to
// netstack: it is read once per mirrored listener, by reflection, from the
// gVisor version go.mod pins. A layout that no longer matches turns the
// fast path off (the SYNs are then shed as before) and TestSYNCookieFastPath
// fails.

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

// cookieKey is one listener's SYN cookie key.
type cookieKey struct {
	nonce [2][sha1.BlockSize]byte
	mu    sync.Mutex // guards h
	h     hash.Hash
}

var errCookieLayout = errors.New("netstack's listener has no SYN cookie key where this build expects one")

// listenerCookieKey reads the SYN cookie key of ep, a listening netstack
// TCP endpoint.
func listenerCookieKey(ep tcpip.Endpoint) (*cookieKey, error) {
	v := reflect.ValueOf(ep)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, errCookieLayout
	}
	ctx := v.Elem().FieldByName("listenCtx")
	if !ctx.IsValid() || ctx.Kind() != reflect.Pointer || ctx.IsNil() || ctx.Elem().Kind() != reflect.Struct {
		return nil, errCookieLayout
	}
	n := ctx.Elem().FieldByName("nonce")
	if !n.IsValid() || n.Type() != reflect.TypeFor[[2][sha1.BlockSize]byte]() {
		return nil, errCookieLayout
	}
	// The nonces are written when the listener is made and never again.
	k := &cookieKey{h: sha1.New()}
	k.nonce = *(*[2][sha1.BlockSize]byte)(unsafe.Pointer(n.UnsafeAddr()))
	return k, nil
}

// hash is tcp/accept.go's cookieHash.
func (k *cookieKey) hash(local, remote []byte, localPort, remotePort uint16, ts uint32, nonce int) uint32 {
	var payload [8]byte
	binary.BigEndian.PutUint16(payload[0:], localPort)
	binary.BigEndian.PutUint16(payload[2:], remotePort)
	binary.BigEndian.PutUint32(payload[4:], ts)
	var sum [sha1.Size]byte
	k.mu.Lock()
	k.h.Reset()
	k.h.Write(payload[:])
	k.h.Write(k.nonce[nonce][:])
	k.h.Write(local)
	k.h.Write(remote)
	k.h.Sum(sum[:0])
	k.mu.Unlock()
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
func (r *Relay) cookieTime() uint32 {
	return uint32(r.wire.Stack.Clock().NowMonotonic().Sub(tcpip.MonotonicTime{}).Seconds()) >> 6 & cookieTSMask
}

// cookieKeyFor finds the key of the mirrored listener netstack would hand
// a SYN to dst:port: one bound to dst, else one on any address of the
// family.
func (r *Relay) cookieKeyFor(dst netip.Addr, port uint16) *cookieKey {
	keys := r.cookieKeys.Load()
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
// mirrored listener. Safe for concurrent use; allocation-light, as it runs
// once per flooding SYN.
func (r *Relay) AnswerSYN(pkt []byte, from tcpip.LinkAddress) bool {
	ipLen, src, dst, ok := tcpHeaderAt(pkt)
	if !ok || len(pkt) < ipLen+header.TCPMinimumSize {
		return false
	}
	syn := header.TCP(pkt[ipLen:])
	off := int(syn.DataOffset())
	if syn.Flags() != tcpFlagSYN || off < header.TCPMinimumSize || len(syn) < off {
		return false
	}
	k := r.cookieKeyFor(dst, syn.DestinationPort())
	if k == nil {
		return false
	}
	opts := header.ParseSynOptions(syn[header.TCPMinimumSize:off], false)
	// What netstack's listener advertises: the route's MTU less the TCP
	// header (tcp.calculateAdvertisedMSS).
	mss := r.wireMTU - header.IPv4MinimumSize - header.TCPMinimumSize
	proto := ipv4.ProtocolNumber
	if dst.Is6() {
		mss = r.wireMTU - header.IPv6MinimumSize - header.TCPMinimumSize
		proto = ipv6.ProtocolNumber
	}
	dstB, srcB := dst.AsSlice(), src.AsSlice()
	cookie := k.cookie(dstB, srcB, syn.DestinationPort(), syn.SourcePort(), syn.SequenceNumber(), encodeCookieMSS(opts.MSS), r.cookieTime())

	p, t := newIPPacket(dst, src, protoTCP, synAckHeaderLen)
	if p == nil {
		return false
	}
	// Like netstack's cookie SYN-ACK: no window scaling (a cookie does
	// not encode it), no SACK, no timestamps; the MSS option only.
	header.TCP(t).Encode(&header.TCPFields{
		SrcPort:    syn.DestinationPort(),
		DstPort:    syn.SourcePort(),
		SeqNum:     cookie,
		AckNum:     syn.SequenceNumber() + 1,
		DataOffset: synAckHeaderLen,
		Flags:      header.TCPFlagSyn | header.TCPFlagAck,
		WindowSize: cookieWindow,
	})
	t[20], t[21] = tcpOptionMSS, 4
	binary.BigEndian.PutUint16(t[22:24], uint16(mss))
	binary.BigEndian.PutUint16(t[16:18], transportChecksum(dst, src, protoTCP, t))
	if err := r.wire.Stack.WritePacketToRemote(r.wire.NIC, from, proto, buffer.MakeWithData(p)); err != nil {
		r.stats.TCPCookieFastErrors.Add(1)
		return false
	}
	r.stats.TCPCookieFast.Add(1)
	return true
}

// publishCookieKeys makes the fast path use the mirrored listeners in eps.
// Called with the mirror's mu held.
func (r *Relay) publishCookieKeys(eps map[mirrorKey]*mirrored) {
	keys := make(map[mirrorKey]*cookieKey, len(eps))
	for k, e := range eps {
		if e.cookies != nil {
			keys[k] = e.cookies
		}
	}
	r.cookieKeys.Store(&keys)
}

// keyOf reads a new mirrored listener's cookie key; a failure leaves that
// listener to netstack's own path, logged once per relay.
func (r *Relay) keyOf(ep tcpip.Endpoint) *cookieKey {
	k, err := listenerCookieKey(ep)
	if err != nil && r.cookieLayoutLogged.CompareAndSwap(false, true) {
		r.opts.Logger.Warn("SYN cookie fast path off: a flood's SYNs beyond the admission cap are dropped instead of answered", "err", fmt.Errorf("reading a listener's SYN cookie key: %w", err))
	}
	return k
}
